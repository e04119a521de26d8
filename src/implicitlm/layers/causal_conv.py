"""Causal depthwise convolution of the Mamba mixers: parallel form and one-token step.

The conv state holds the last ``kernel`` inputs, shape (b, channels, kernel). The
parallel form runs as ``kernel`` shifted multiply-adds in the (b, l, channels) layout the
projections produce, with a hand-written backward of the same shape: no transposes, no
depthwise-convolution kernel (several times slower on CPU, backward above all), and none
of the full-size zero tensors autograd would build for each shifted slice.
"""

from __future__ import annotations

import torch


def causal_conv(
    inputs: torch.Tensor, state: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
    padding: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """inputs: (b, l, c); state: (b, c, k), the inputs before the first token, or None for
    the start of a sequence (zeros); weight: (c, 1, k) as ``nn.Conv1d`` stores it. Output t
    sees inputs t - k + 1 .. t only. ``padding``: (b, l) bool, True at real tokens, whose
    inputs the caller has zeroed elsewhere. Returns (pre-activation output (b, l, c), next
    state (b, c, k))."""
    kernel = weight.shape[-1]
    if state is None:
        window = torch.cat([inputs.new_zeros(inputs.shape[0], kernel - 1, inputs.shape[2]), inputs], dim=1)
    else:
        window = torch.cat([state[:, :, 1:].transpose(1, 2), inputs], dim=1)  # b, l + k - 1, c
        # Without a state the window before the first token is zeros, as padding is: only
        # padding after a state needs moving in front of it (not on every iteration of a solve).
        if padding is not None:
            window = _leading_padding_first(window, padding, kernel - 1)
    output = _ShiftedMultiplyAdd.apply(window, weight[:, 0, :], bias)
    # A copy, not a view: a view would keep the whole window alive inside the state.
    return output, window[:, -kernel:].transpose(1, 2).contiguous()


def _leading_padding_first(window: torch.Tensor, padding: torch.Tensor, history: int) -> torch.Tensor:
    """``window`` (the state's last ``history`` inputs, then the tokens') with each row's
    leading padding moved in front of the state's inputs: a row left-padded after a state
    then shows its first real tokens the inputs before the padding, as without padding;
    otherwise they would read the padding's zeros in their place."""
    leading = (padding.long().cumsum(dim=1) == 0).sum(dim=1, keepdim=True)  # (b, 1)
    position = torch.arange(window.shape[1], device=window.device)
    source = torch.where(
        position < leading, position + history, torch.where(position < leading + history, position - leading, position)
    )
    return window.gather(1, source.unsqueeze(-1).expand(-1, -1, window.shape[-1]))


def causal_conv_step(
    inputs: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: inputs (b, c). Returns (pre-activation output (b, c), next state)."""
    state = torch.cat([state[:, :, 1:], inputs.unsqueeze(-1)], dim=-1)
    return (state * weight[:, 0, :]).sum(-1) + bias, state


class _ShiftedMultiplyAdd(torch.autograd.Function):
    """output[:, t] = bias + sum_k window[:, t + k] * taps[:, k] for t < l = len(window) - k + 1."""

    @staticmethod
    def forward(window: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        kernel = taps.shape[-1]
        length = window.shape[1] - kernel + 1
        output = window[:, :length] * taps[:, 0]
        output.add_(bias)
        for k in range(1, kernel):
            output.addcmul_(window[:, k : k + length], taps[:, k])
        return output

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        window, taps, _ = inputs
        ctx.save_for_backward(window, taps)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        window, taps = ctx.saved_tensors
        kernel, length = taps.shape[-1], grad_output.shape[1]
        grad_window = grad_taps = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_window = window.new_zeros(window.shape)
            for k in range(kernel):
                grad_window[:, k : k + length].addcmul_(grad_output, taps[:, k])
        if ctx.needs_input_grad[1]:
            grad_taps = torch.stack(
                [(grad_output * window[:, k : k + length]).sum((0, 1)) for k in range(kernel)], dim=-1
            )
        if ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum((0, 1))
        return grad_window, grad_taps, grad_bias
