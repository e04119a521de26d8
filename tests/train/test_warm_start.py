"""A run started from another run's weights (``train --init-from``): explicit to implicit as
from a transformers checkpoint, implicit to implicit unchanged, the batches going on where the
source run stopped, and the starts that are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

from implicitlm.cli import main
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.data.corpus import read_documents
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.models import ModelLoadError, build_model, load_model
from implicitlm.models.convert import from_hf_mamba2, initialise_from
from tests.support.models import SMALL, tiny_model, token_ids

SEQUENCE, BATCH = 32, 4


def small_model(architecture: str, implicit: bool, seed: int, **changes):
    return tiny_model(seed, **{**SMALL[architecture], "vocab_size": 64, "implicit": implicit, **changes})


def logits(model, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(token_ids(2, 19, seed=1, vocab=64), **kwargs).logits


def effective_weights(model) -> dict[str, torch.Tensor]:
    """Every weight by its plain name, weight norm's (g, v) folded into the weight they make."""
    weights = {}
    for name in model.state_dict():
        head, marker, rest = name.partition("parametrizations.")
        plain = head + rest.split(".")[0] if marker else name
        module_name, _, attribute = plain.rpartition(".")
        weights[plain] = getattr(model.get_submodule(module_name), attribute).detach().clone()
    return weights


@pytest.mark.parametrize("architecture", SMALL)
def test_an_implicit_model_started_from_an_explicit_one_has_its_weights_and_block_one_as_injection(architecture):
    explicit = small_model(architecture, implicit=False, seed=0)
    implicit = initialise_from(small_model(architecture, implicit=True, seed=1), explicit)
    source, started = effective_weights(explicit), effective_weights(implicit)
    assert set(started) - set(source) == {"injection.weight", "injection_norm.weight"}
    # Weight norm stores a weight as (||w||, w): its effective value is w to rounding.
    for name, weight in source.items():
        torch.testing.assert_close(started[name], weight, rtol=1e-6, atol=1e-7, msg=name)
    layer = implicit.stack.layers[0]
    if architecture == "llama":
        attention = layer.self_attn
        first = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        first_norm = layer.input_layernorm.weight
    else:
        first, first_norm = layer.mixer.in_proj.weight, layer.norm.weight
    torch.testing.assert_close(started["injection.weight"], first, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(started["injection_norm.weight"], first_norm, rtol=0, atol=0)


def test_the_warm_start_is_the_import_of_the_same_weights_from_transformers():
    torch.manual_seed(0)
    hf = Mamba2ForCausalLM(Mamba2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2, state_size=16,
        n_groups=1, conv_kernel=4, chunk_size=8, tie_word_embeddings=True, use_bias=False,
    )).eval()
    imported = from_hf_mamba2(hf, implicit=True)
    explicit = from_hf_mamba2(hf)
    torch.manual_seed(5)
    started = initialise_from(build_model(imported.config.__class__(**imported.config.to_dict())), explicit)
    for iterations in (1, 3):
        assert torch.equal(logits(started, max_iter=iterations), logits(imported, max_iter=iterations))


@pytest.mark.slow
def test_an_implicit_model_started_from_an_implicit_one_computes_what_it_did():
    source = small_model("mamba2", implicit=True, seed=0)
    fixed_point = {"max_iter": 40, "tol": 1e-3}
    started = initialise_from(small_model("mamba2", implicit=True, seed=1, fixed_point=fixed_point), source)
    expected = logits(source, max_iter=6, tol=1e-6)
    # Equal to weight norm's rounding; the model before the start is far off.
    torch.testing.assert_close(logits(started, max_iter=6, tol=1e-6), expected, rtol=1e-5, atol=1e-6)
    unstarted = logits(small_model("mamba2", implicit=True, seed=1), max_iter=6, tol=1e-6)
    assert (unstarted - expected).abs().max() > 1e-2


@pytest.mark.parametrize(
    "target, source, message",
    [
        (("mamba2", False, {}), ("mamba2", True, {}), "cannot start an explicit model from an implicit one"),
        (("mamba2", True, {}), ("llama", False, {}), "cannot start a model of type implicit_mamba2 from one of type implicit_llama"),
        (("mamba2", True, {"hidden_size": 24, "head_dim": 12}), ("mamba2", False, {}), r"shape \(64, 16\) in the checkpoint"),
        (("mamba2", True, {"num_hidden_layers": 1}), ("mamba2", False, {}), r"unexpected \['stack.layers.1"),
    ],
    ids=["implicit-to-explicit", "other-family", "other-width", "other-depth"],
)
def test_a_start_from_weights_that_do_not_fit_is_refused_by_name(target, source, message):
    model = small_model(target[0], target[1], seed=0, **target[2])
    with pytest.raises(ModelLoadError, match=message):
        initialise_from(model, small_model(source[0], source[1], seed=0, **source[2]))


# ---------------------------------------------------------------- through the command line


def train_command(shards: Path, out: Path, *options: str) -> list[str]:
    settings = [f"sequence_length={SEQUENCE}", f"batch_size={BATCH}", f"batch_tokens={BATCH * SEQUENCE}",
                "warmup_steps=0", "bounded_fraction=0", "free_max_iter=4", "free_phantom_steps=1", "checkpoint_every=0"]
    return ["train", "--data", str(shards), "--out", str(out), "--no-progress",
            *[arg for setting in settings for arg in ("--train", setting)], *options]


@pytest.fixture(scope="module")
def explicit_run(shards, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("explicit") / "run"
    widths = ["hidden_size=16", "num_hidden_layers=1", "state_size=8", "head_dim=8", "chunk_size=16", "implicit=false"]
    assert main(train_command(shards, out, "--train", "total_steps=3", *[a for w in widths for a in ("--model", w)])) == 0
    return out


def sampler_position(run: Path) -> int:
    state = torch.load(latest_checkpoint(run) / "training_state.pt", weights_only=True)
    return state["sampler"]["epoch"] * state["sampler"]["windows"] + state["sampler"]["position"]


def test_an_implicit_run_from_an_explicit_run_starts_at_its_weights_and_goes_on_with_its_batches(
    shards, explicit_run, tmp_path
):
    # A learning rate of 1e-12 moves no weight visibly, so the saved model is the start.
    out = tmp_path / "implicit"
    command = train_command(shards, out, "--init-from", str(explicit_run), "--model", "implicit=true",
                            "--train", "total_steps=2", "--train", "lr=1e-12", "--train", "min_lr=0")
    assert main(command) == 0
    source, started = load_model(explicit_run), load_model(out)
    assert started.config.implicit and started.config.hidden_size == 16
    source_weights, started_weights = effective_weights(source), effective_weights(started)
    for name, weight in source_weights.items():
        torch.testing.assert_close(started_weights[name], weight, rtol=1e-6, atol=1e-7, msg=name)
    torch.testing.assert_close(started_weights["injection.weight"], source_weights["stack.layers.0.mixer.in_proj.weight"],
                               rtol=1e-6, atol=1e-7)
    assert sampler_position(out) == sampler_position(explicit_run) + 2 * BATCH
    meta = json.loads((latest_checkpoint(out) / "trainer.json").read_text())
    assert meta["initialised_from"] == str(latest_checkpoint(explicit_run))
    # The source's stage, as its own record says it, is the first of the new model's lineage.
    source_meta = json.loads((latest_checkpoint(explicit_run) / "trainer.json").read_text())
    assert meta["lineage"] == [{key: source_meta[key] for key in ("step", "train", "processes")} | {"implicit": False}]
    card = (latest_checkpoint(out) / "README.md").read_text()
    assert "1. explicit, from scratch: 3 steps, 384 tokens (lm task, sequence length 32)\n" in card
    assert f"2. implicit, from stage 1 ({latest_checkpoint(explicit_run)}): 2 steps, 256 tokens" in card
    assert "In all: 5 steps, 640 tokens." in card


def test_a_warm_started_run_resumes_with_its_origin(shards, explicit_run, tmp_path):
    out = tmp_path / "explicit_more"
    assert main(train_command(shards, out, "--init-from", str(explicit_run), "--train", "total_steps=1")) == 0
    assert load_model(out).config.implicit is False
    assert main(["train", "--data", str(shards), "--out", str(out), "--resume", "--no-progress",
                 "--train", "total_steps=2"]) == 0
    meta = json.loads((latest_checkpoint(out) / "trainer.json").read_text())
    assert meta["step"] == 2 and meta["initialised_from"] == str(latest_checkpoint(explicit_run))
    assert [(stage["step"], stage["implicit"]) for stage in meta["lineage"]] == [(3, False)]
    assert sampler_position(out) == sampler_position(explicit_run) + 2 * BATCH


def test_another_batch_order_starts_from_the_beginning(shards, explicit_run, tmp_path):
    out = tmp_path / "other_seed"
    assert main(train_command(shards, out, "--init-from", str(explicit_run), "--train", "total_steps=1",
                              "--train", "seed=3")) == 0
    assert sampler_position(out) == BATCH


@pytest.mark.parametrize(
    "options, message",
    [
        (["--resume"], "--resume continues the run from its own weights"),
        (["--model-preset", "mamba2-130m-free"], "--model-preset cannot choose another"),
        (["--model", "hidden_size=24"], "shape"),
    ],
    ids=["resume", "model-preset", "other-width"],
)
def test_a_warm_start_that_cannot_be_made_is_one_line(shards, explicit_run, tmp_path, capsys, options, message):
    code = main(train_command(shards, tmp_path / "run", "--init-from", str(explicit_run), "--train", "total_steps=1",
                              *options))
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not latest_checkpoint(tmp_path / "run")


def test_a_warm_start_on_another_vocabulary_is_refused(explicit_run, tmp_path, capsys):
    sources = sorted((Path(__file__).parents[2] / "src" / "implicitlm" / "eval").glob("*.py"))
    tokenizer = train_tokenizer(read_documents(sources), 280, tmp_path / "tokenizer")
    write_shards(read_documents(sources), tokenizer, tmp_path / "data", test_fraction=0.2, progress=False)
    code = main(train_command(tmp_path / "data", tmp_path / "run", "--init-from", str(explicit_run)))
    err = capsys.readouterr().err
    assert code == 2 and "a model of 300 tokens, but the shards' tokenizer has 280" in err, err
