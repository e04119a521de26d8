"""The gated RMSNorm's hand-written backward against autograd of the plain formula."""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

from implicitlm.layers.norms import GatedRMSNorm, rms_normalize


def plain_gated_norm(norm: GatedRMSNorm, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    grouped = (x * torch.nn.functional.silu(gate)).unflatten(-1, (-1, norm.group_size))
    return norm.weight * rms_normalize(grouped, norm.eps).flatten(-2)


def make_norm(group_size: int, dtype=torch.float64) -> GatedRMSNorm:
    norm = GatedRMSNorm(8, group_size=group_size).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=torch.Generator().manual_seed(0), dtype=dtype))
    return norm


def random_inputs(*shape, seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, 8, generator=gen, dtype=dtype, requires_grad=True) for _ in range(2)]


@pytest.mark.parametrize("group_size", [8, 4])
def test_output_and_gradients_match_autograd(group_size):
    norm = make_norm(group_size)
    x, gate = random_inputs(3, 5, seed=1)
    weights = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    leaves = (x, gate, norm.weight)
    ours = norm(x, gate)
    plain = plain_gated_norm(norm, x, gate)
    torch.testing.assert_close(ours, plain, rtol=1e-14, atol=1e-14)
    ours_grads = torch.autograd.grad((ours * weights).sum(), leaves)
    plain_grads = torch.autograd.grad((plain * weights).sum(), leaves)
    for name, g, g_ref in zip(["x", "gate", "weight"], ours_grads, plain_grads):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def test_jacobian_through_torch_func_matches_the_plain_formula():
    # The Jacobian analysis differentiates the step form with torch.func.jacrev.
    norm = make_norm(4)
    x, gate = (t.detach() for t in random_inputs(2, seed=3))
    ours = jacrev(norm, argnums=(0, 1))(x, gate)
    plain = jacrev(lambda x, g: plain_gated_norm(norm, x, g), argnums=(0, 1))(x, gate)
    for j, j_ref in zip(ours, plain):
        torch.testing.assert_close(j, j_ref, rtol=1e-12, atol=1e-12)


def test_bfloat16_is_normalised_in_float32():
    norm = make_norm(8, dtype=torch.bfloat16)
    x, gate = (t.detach() for t in random_inputs(4, seed=4, dtype=torch.bfloat16))
    out = norm(x, gate)
    assert out.dtype == torch.bfloat16
    reference = plain_gated_norm(make_norm(8), x.double(), gate.double())
    torch.testing.assert_close(out.double(), reference, rtol=2e-2, atol=2e-2)
