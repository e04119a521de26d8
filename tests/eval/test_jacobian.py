"""Theorem 1: the state-to-state Jacobian is diagonal for explicit Mamba, dense for implicit Mamba2."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from implicitlm.cli import main
from implicitlm.eval.jacobian import jacobian_analysis, off_diagonal_share, select_coordinates, state_jacobian

from tests.support.contractive import make_contractive
from tests.support.models import tiny_model, token_ids

VOCAB = 12
MAMBA2 = dict(architecture="mamba2", state_size=8, head_dim=8, chunk_size=4)
MAMBA1 = dict(architecture="mamba", state_size=4)
# A step size nearer 1 than Mamba2's default [1e-3, 0.1]: the state decays and takes in the
# token's (z-dependent) input at a rate that makes the implicit coupling large.
FAST = dict(time_step_min=0.1, time_step_max=1.0)
TIGHT = dict(max_iter=2000, tol=1e-12)


def make_model(family: dict, implicit: bool, layers: int = 1, **options):
    return tiny_model(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers, implicit=implicit, **family,
                      **options).double().eval()


def test_off_diagonal_share_of_known_matrices():
    assert off_diagonal_share(torch.diag(torch.tensor([1.0, -2.0, 3.0]))) == 0.0
    assert off_diagonal_share(torch.tensor([[0.0, 1.0], [1.0, 0.0]])) == 1.0
    assert off_diagonal_share(torch.tensor([[3.0, 4.0], [0.0, 0.0]])) == pytest.approx(0.8)


def test_coordinates_are_a_seeded_sorted_subset_of_the_state():
    model = make_model(MAMBA2, implicit=False)  # state of one layer: 4 heads x 8 x 8 = 256
    chosen = select_coordinates(model, coordinates=20, seed=3)
    assert torch.equal(chosen, select_coordinates(model, coordinates=20, seed=3))
    assert len(set(chosen.tolist())) == 20 and bool((chosen.diff() > 0).all()) and chosen.max() < 256
    assert not torch.equal(chosen, select_coordinates(model, coordinates=20, seed=4))
    assert len(select_coordinates(model, coordinates=1000)) == 256
    with pytest.raises(ValueError, match="indices in"):
        select_coordinates(model, coordinates=[0, 256])


@pytest.mark.parametrize("family", [MAMBA2, MAMBA1], ids=["mamba2", "mamba1"])
def test_explicit_jacobian_is_diagonal_in_every_layer(family):
    model = make_model(family, implicit=False, layers=2)
    for layer in (0, 1):
        analysis = jacobian_analysis(model, token_ids(2, 8, seed=0, vocab=VOCAB), [0, 4, 7], layer=layer, coordinates=48)
        metrics = analysis["metrics"]
        assert metrics["off_diagonal_share_max"] < 1e-6
        # Decays exp(dt A) with dt > 0 and A < 0.
        assert 0 < metrics["diagonal_min"] <= metrics["diagonal_max"] < 1
        assert len(analysis["rows"]) == 6 and analysis["representative"]["jacobian"].shape == (48, 48)


@pytest.mark.parametrize("layer", [0, 1])
def test_explicit_mamba2_diagonal_is_the_decay_of_the_token(layer):
    model = make_model(MAMBA2, implicit=False, layers=2)
    ids, position = token_ids(1, 7, seed=1, vocab=VOCAB), 5
    jacobian, chosen = state_jacobian(model, ids[0], position, layer=layer, coordinates=256)
    # The decay exp(dt A) of each head, from the layer's own parameters at this token: dt
    # reads the layer's input, which is the embedding run through the layers below.
    with torch.no_grad():
        prefix = model(ids[:, :position], mode="sequential").state
        z = model.embeddings(ids[:, position])
        for below in range(layer):
            z = model.stack.layers[below].step(z, None, prefix[below])[0]
        block = model.stack.layers[layer]
        mixer = block.mixer
        heads = mixer.dims.nheads
        dt = F.softplus(mixer.in_proj(block.norm(z))[0, -heads:] + mixer.dt_bias)
        decay = torch.exp(-dt * torch.exp(mixer.A_log))
    per_head = mixer.dims.headdim * mixer.dims.d_state
    torch.testing.assert_close(jacobian.diagonal(), decay[chosen // per_head], rtol=1e-12, atol=0)
    assert off_diagonal_share(jacobian) < 1e-6


@pytest.mark.slow
def test_implicit_mamba2_jacobian_is_not_diagonal():
    model = make_model(MAMBA2, implicit=True, fixed_point=TIGHT, **FAST)
    analysis = jacobian_analysis(model, token_ids(1, 8, seed=0, vocab=VOCAB), [3, 7], coordinates=64)
    metrics = analysis["metrics"]
    assert metrics["fp_rel_residual_max"] < 1e-10, "the Jacobian is taken at converged fixed points"
    assert metrics["off_diagonal_share_min"] > 1e-2


@pytest.mark.slow
def test_ift_equals_unroll_and_finite_differences_on_a_contractive_model():
    model = make_contractive(make_model(MAMBA2, implicit=True, layers=2, fixed_point=TIGHT, **FAST))
    ids, position, layer = token_ids(1, 4, seed=2, vocab=VOCAB), 2, 1
    ift, chosen = state_jacobian(model, ids[0], position, layer=layer, coordinates=12, method="ift")
    unroll, same = state_jacobian(model, ids[0], position, layer=layer, coordinates=12, method="unroll")
    assert torch.equal(chosen, same)
    # Off-diagonal entries far above the tolerance: the comparison sees the coupling.
    assert (ift - torch.diag(ift.diagonal())).abs().max() > 1e-5
    torch.testing.assert_close(unroll, ift, rtol=0, atol=1e-9)
    # Central differences through the model's own sequential mode: the token's state after
    # its fixed point, with one coordinate of the state before it moved by +-eps.
    with torch.no_grad():
        prefix = model(ids[:, :position], mode="sequential").state

        def committed(column: int, eps: float) -> torch.Tensor:
            ssm = prefix[layer].ssm.clone()
            ssm.view(-1)[chosen[column]] += eps
            state = [*prefix[:layer], dataclasses.replace(prefix[layer], ssm=ssm), *prefix[layer + 1 :]]
            after = model(ids[:, position : position + 1], mode="sequential", state=state).state
            return after[layer].ssm.reshape(-1)[chosen]

        eps = 1e-6
        for column in (0, 7):
            difference = (committed(column, eps) - committed(column, -eps)) / (2 * eps)
            torch.testing.assert_close(difference, ift[:, column], rtol=0, atol=1e-7)


def test_attention_models_are_refused():
    model = make_model(dict(architecture="llama", num_attention_heads=2), implicit=True)
    with pytest.raises(ValueError, match="not a fixed-size state"):
        state_jacobian(model, token_ids(1, 4, seed=0, vocab=VOCAB)[0], 2)


@pytest.mark.slow
def test_cli_writes_a_record_per_model_and_the_heatmaps(tmp_path, capsys):
    options = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, **MAMBA2, **FAST)
    explicit, implicit = tmp_path / "explicit.json", tmp_path / "implicit.json"
    explicit.write_text(json.dumps({**options, "implicit": False}))
    implicit.write_text(json.dumps({**options, "implicit": True, "fixed_point": {"max_iter": 100, "tol": 1e-6}}))
    common = ["--length", "6", "--count", "1", "--coordinates", "16", "--no-progress"]

    assert main(["jacobian", str(explicit), str(implicit), "--out", str(tmp_path / "both"), *common]) == 0
    table = capsys.readouterr().out
    records = {}
    for label in ("explicit", "implicit"):
        records[label] = json.loads((tmp_path / "both" / label / "jacobian.json").read_text())
        assert (tmp_path / "both" / label / "jacobian.png").stat().st_size > 0
        assert label in table
    assert (tmp_path / "both" / "jacobian.png").stat().st_size > 0
    assert records["explicit"]["metrics"]["off_diagonal_share_max"] == 0.0
    assert records["implicit"]["metrics"]["off_diagonal_share_median"] > 1e-3
    assert records["implicit"]["positions"] == [1, 3, 4, 5] and len(records["implicit"]["rows"]) == 4
    assert len(records["implicit"]["representative"]["jacobian"]) == 16

    assert main(["jacobian", str(implicit), "--out", str(tmp_path / "one"), "--positions", "2,5", *common]) == 0
    record = json.loads((tmp_path / "one" / "jacobian.json").read_text())
    assert record["experiment"] == "jacobian" and record["positions"] == [2, 5]
    assert (tmp_path / "one" / "jacobian.png").is_file()


def test_cli_refuses_an_attention_model_in_one_line(tmp_path, capsys):
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps(dict(architecture="llama", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, implicit=True)))
    code = main(["jacobian", str(llama), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "implicitlm: error:" in err and "fixed-size state" in err


def test_cli_refuses_jacobians_past_the_time_limit_before_the_first(tmp_path, capsys, monkeypatch):
    """Before: no estimate; Jacobians were computed until the run was killed."""
    from implicitlm.eval import jacobian

    implicit = tmp_path / "implicit.json"
    implicit.write_text(json.dumps(dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, implicit=True, **MAMBA2,
                                        **FAST)))
    timed = []
    # One Jacobian timed at a day: four of them, at the default positions, take four.
    monkeypatch.setattr(jacobian, "seconds_of", lambda run: timed.append(run()) or 86400.0)
    monkeypatch.setattr(jacobian, "_row", lambda *args: pytest.fail("a Jacobian was computed for the record"))
    code = main(["jacobian", str(implicit), "--out", str(tmp_path / "out"), "--length", "6", "--count", "1",
                 "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(timed) == 1 and not (tmp_path / "out").exists()
    assert err[0].startswith("implicitlm: error: 4 Jacobians (1 sequence(s), 4 position(s) each) would take at least "
                             "4.0 days")
    assert err[0].endswith("; give a smaller --count or fewer --positions")


def test_an_analysis_given_fixed_point_options_solves_by_them_and_leaves_the_model_s_own():
    """Every solve of the analysis, the prefix's forwards and the token's own, by the options it
    is given (before: ``eval jacobian`` set them on the model it analysed)."""
    model = make_contractive(make_model(MAMBA2, implicit=True, fixed_point=TIGHT, **FAST))
    own = model.solver.options
    ids = token_ids(1, 6, seed=1, vocab=VOCAB)[0]
    by_options, chosen = state_jacobian(model, ids, 4, coordinates=12, method="unroll",
                                        fixed_point={"max_iter": 2})
    by_budget, same = state_jacobian(model, ids, 4, coordinates=12, method="unroll", max_iter=2)
    tight, _ = state_jacobian(model, ids, 4, coordinates=12, method="unroll")
    assert torch.equal(chosen, same) and torch.equal(by_options, by_budget)
    assert not torch.allclose(by_options, tight)  # two passes are not the fixed point's
    assert model.solver.options == own
