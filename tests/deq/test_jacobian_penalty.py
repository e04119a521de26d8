"""The Jacobian penalty of training: its estimate, its gradient, and what it does to a model."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradgradcheck

from implicitlm.deq import FixedPointOptions, OptionError, penalised
from implicitlm.deq.solve import jacobian_frobenius
from implicitlm.layers.causal_conv import causal_conv
from implicitlm.layers.ssd import ssd_chunked
from implicitlm.models import ImplicitMamba2ForCausalLM
from tests.support.models import tiny_model


def penalty_model(penalty: float, dtype=torch.float64) -> ImplicitMamba2ForCausalLM:
    fixed_point = {"train_max_iter": 6, "phantom_steps": 2, "train_tol": 1e-4, "jacobian_penalty": penalty}
    return tiny_model(vocab_size=6, hidden_size=8, num_hidden_layers=2, state_size=4, head_dim=4, expand=2, chunk_size=4,
                      implicit=True, label_alignment="aligned", fixed_point=fixed_point).to(dtype)


def stack_map(model, input_ids):
    """z -> f(z, u) of ``model`` for ``input_ids``, as its solver sees it."""
    u = model.injection(model.injection_norm(model.embeddings(input_ids)))
    return lambda z: model.stack(z, u)[0]


@pytest.mark.slow
def test_estimate_is_unbiased_for_the_exact_frobenius_norm():
    model = penalty_model(0.0)
    ids = torch.randint(0, 6, (2, 10), generator=torch.Generator().manual_seed(1))
    f = stack_map(model, ids)
    z = 0.5 * torch.randn(2, 10, 8, dtype=torch.float64)
    exact = torch.autograd.functional.jacobian(f, z).pow(2).sum() / z.numel()
    torch.manual_seed(2)
    estimates = torch.stack([jacobian_frobenius(f, z).detach() for _ in range(1500)])
    # One Gaussian probe: mean ||J||_F^2 / n; 1,500 of them put the mean within a few percent.
    assert estimates.mean().item() == pytest.approx(exact.item(), rel=0.06)
    assert estimates.std().item() > 0.01 * exact.item()  # a random estimate, not the exact value


@pytest.mark.slow
def test_scan_and_conv_backward_passes_are_differentiable():
    """The penalty differentiates a backward pass: the hand-written ones of the SSD's scan
    across chunks (several chunks here) and of the causal conv must give exact second
    derivatives."""
    gen = torch.Generator().manual_seed(0)
    b, length, heads, headdim, d_state = 2, 10, 2, 3, 4

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    x, B, C, initial = rand(b, length, heads, headdim), rand(b, length, 1, d_state), rand(b, length, 1, d_state), \
        rand(b, heads, headdim, d_state)
    dt = (0.1 + 0.5 * torch.rand(b, length, heads, generator=gen, dtype=torch.float64)).requires_grad_()
    A = -(0.5 + torch.rand(heads, generator=gen, dtype=torch.float64))
    assert gradgradcheck(lambda *t: ssd_chunked(t[0], t[1], A, t[2], t[3], chunk_size=4, initial_state=t[4]),
                         (x, dt, B, C, initial))
    inputs, state = rand(2, 7, 5), rand(2, 5, 4)
    weight, bias = rand(5, 1, 4), rand(5)
    assert gradgradcheck(causal_conv, (inputs, state, weight, bias))


def attention_model(penalty: float, dtype=torch.float64):
    fixed_point = {"train_max_iter": 6, "phantom_steps": 2, "train_tol": 1e-4, "jacobian_penalty": penalty}
    return tiny_model(architecture="llama", vocab_size=6, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                      implicit=True, label_alignment="aligned", fixed_point=fixed_point).to(dtype)


# A model under the penalty, and the weight whose gradient is checked: Mamba2's decay, and a
# query projection of attention, whose fused kernels have no double backward (the CPU's flash
# kernel refuses one), so the penalty's pass runs the math kernel.
PENALISED = {
    "mamba2": (penalty_model, lambda model: model.stack.layers[0].mixer.A_log),
    "llama": (attention_model, lambda model: model.stack.layers[0].self_attn.q_proj.parametrizations.weight.original1),
}


@pytest.mark.parametrize("family", sorted(PENALISED))
def test_penalty_gradient_matches_finite_differences(family):
    """d(penalty)/d(weights) by autograd (a backward of a backward) against a central
    difference, with the same probe vector on every evaluation."""
    build, chosen = PENALISED[family]
    model = build(1.0)
    ids = torch.randint(0, 6, (2, 10), generator=torch.Generator().manual_seed(1))
    f = stack_map(model, ids)
    z = 0.5 * torch.randn(2, 10, 8, dtype=torch.float64)
    weight = chosen(model)

    def penalty() -> torch.Tensor:
        torch.manual_seed(5)
        return jacobian_frobenius(f, z)

    (grad,) = torch.autograd.grad(penalty(), weight)
    direction = torch.randn_like(weight)
    step = 1e-6
    with torch.no_grad():
        weight.add_(step * direction)
        upper = penalty().item()
        weight.sub_(2 * step * direction)
        lower = penalty().item()
        weight.add_(step * direction)
    assert (grad * direction).sum().item() == pytest.approx((upper - lower) / (2 * step), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_an_attention_model_trains_under_the_penalty(dtype):
    model = attention_model(0.5, dtype).train()
    ids = torch.randint(0, 6, (2, 8), generator=torch.Generator().manual_seed(3))
    out = model(ids, labels=ids)
    penalised(out.loss, out.fixed_point).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert out.fixed_point.jacobian_penalty.item() > 0
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


def test_training_forward_carries_the_weighted_penalty():
    ids = torch.randint(0, 6, (2, 8), generator=torch.Generator().manual_seed(3))
    plain, penalised_model = penalty_model(0.0).train(), penalty_model(0.5).train()
    out_plain, out = plain(ids, labels=ids), penalised_model(ids, labels=ids)
    assert out_plain.fixed_point.jacobian_penalty is None
    assert penalised(out_plain.loss, out_plain.fixed_point) is out_plain.loss
    assert out.loss.item() == pytest.approx(out_plain.loss.item())  # the task loss itself is untouched
    term = out.fixed_point.jacobian_penalty
    assert term.requires_grad and term.item() > 0
    assert penalised(out.loss, out.fixed_point).item() == pytest.approx(out.loss.item() + term.item())
    assert "fp_jacobian_penalty" in out.fixed_point.summary()
    penalised_model.eval()
    with torch.no_grad():
        assert penalised_model(ids).fixed_point.jacobian_penalty is None  # training only


@pytest.mark.slow
def test_penalty_makes_the_map_contract():
    """The same model, seed and steps, with and without the penalty: trained with it, the
    map's Jacobian at its fixed point is smaller and evaluation solves need fewer iterations."""
    ids = torch.randint(0, 6, (8, 12), generator=torch.Generator().manual_seed(4))
    jacobians, iterations = {}, {}
    for penalty in (0.0, 2.0):
        model = penalty_model(penalty, dtype=torch.float32).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(40):
            out = model(ids, labels=ids)
            penalised(out.loss, out.fixed_point).backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            solved = model(ids, tol=1e-4, max_iter=200, chunk_length=0, output_hidden_states=True)
        z_star = solved.hidden_states[-1]
        torch.manual_seed(0)
        jacobians[penalty] = torch.stack(
            [jacobian_frobenius(stack_map(model, ids), z_star).detach() for _ in range(50)]
        ).mean().item()
        iterations[penalty] = solved.fixed_point.passes.float().mean().item()
    assert jacobians[2.0] < 0.7 * jacobians[0.0]
    assert iterations[2.0] < iterations[0.0]


@pytest.mark.parametrize("value", [-0.1, float("inf"), True, "1"])
def test_penalty_option_is_validated(value):
    with pytest.raises(OptionError, match="jacobian_penalty"):
        FixedPointOptions(jacobian_penalty=value)
