"""The mixers' causal depthwise conv against torch's own conv1d, and its hand-written backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from implicitlm.layers.causal_conv import causal_conv, causal_conv_step


def random_conv(batch=2, length=7, channels=5, kernel=4, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    return randn(batch, length, channels), randn(batch, channels, kernel), randn(channels, 1, kernel), randn(channels)


def conv1d_oracle(inputs, state, weight, bias):
    padded = torch.cat([state[:, :, 1:], inputs.transpose(1, 2)], dim=2)
    return F.conv1d(padded, weight, bias, groups=weight.shape[0]).transpose(1, 2)


@pytest.mark.parametrize("length", [1, 3, 7])
def test_matches_torch_conv1d(length):
    inputs, state, weight, bias = random_conv(length=length)
    output, next_state = causal_conv(inputs, state, weight, bias)
    torch.testing.assert_close(output, conv1d_oracle(inputs, state, weight, bias), rtol=1e-12, atol=1e-12)
    # The next state holds the last `kernel` inputs, whatever the length.
    everything = torch.cat([state, inputs.transpose(1, 2)], dim=2)
    torch.testing.assert_close(next_state, everything[:, :, -4:], rtol=0, atol=0)


def test_backward_matches_autograd_of_conv1d():
    leaves = random_conv(seed=1)
    weights = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = torch.autograd.grad((causal_conv(*leaves)[0] * weights).sum(), leaves)
    oracle = torch.autograd.grad((conv1d_oracle(*leaves) * weights).sum(), leaves)
    for name, g, g_ref in zip(["inputs", "state", "weight", "bias"], ours, oracle):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    assert torch.autograd.gradcheck(lambda *t: causal_conv(*t)[0], random_conv(length=3, seed=3))


def test_steps_match_parallel_form():
    inputs, state, weight, bias = (t.detach() for t in random_conv(seed=4))
    parallel, final = causal_conv(inputs, state, weight, bias)
    outputs = []
    for t in range(inputs.shape[1]):
        out, state = causal_conv_step(inputs[:, t], state, weight, bias)
        outputs.append(out)
    torch.testing.assert_close(torch.stack(outputs, dim=1), parallel, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, final, rtol=0, atol=0)
