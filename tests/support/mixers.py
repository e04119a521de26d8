"""What the tests of the token mixers (Mamba2, Mamba1, attention) share: float64 inputs, a
run one step at a time, and the check that changing a token reaches no earlier output."""

from __future__ import annotations

import torch


def randn(*shape, seed: int, dtype: torch.dtype = torch.float64, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def mixer_inputs(dims, batch: int, length: int, with_injection: bool, seed: int,
                 device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(hidden, injection or None) of a mixer of ``dims``, drawn with ``seed`` and ``seed + 1``."""
    injection = randn(batch, length, dims.d_in_proj, seed=seed + 1, device=device) if with_injection else None
    return randn(batch, length, dims.d_model, seed=seed, device=device), injection


def run_steps(mixer, hidden, injection, state):
    """The mixer's ``step`` over every position from ``state``: (the outputs, the last state)."""
    outputs = []
    for t in range(hidden.shape[1]):
        out, state = mixer.step(hidden[:, t], None if injection is None else injection[:, t], state)
        outputs.append(out)
    return torch.stack(outputs, dim=1), state


def assert_token_t_changes_no_earlier_output(mixer, hidden, injection, t: int) -> None:
    """Token ``t``'s input and injection changed: the outputs before ``t`` stay exactly the same, ``t``'s moves."""
    changed_hidden, changed_injection = hidden.clone(), injection.clone()
    changed_hidden[:, t] += 1.0
    changed_injection[:, t] -= 1.0

    out, _ = mixer(hidden, injection)
    out_changed, _ = mixer(changed_hidden, changed_injection)

    assert torch.equal(out_changed[:, :t], out[:, :t])
    assert (out_changed[:, t] - out[:, t]).abs().max() > 1e-3


def assert_step_leaves_its_state(mixer, prompt: torch.Tensor, token: torch.Tensor) -> None:
    """A step from the (conv, ssm) state of ``prompt`` leaves that state's tensors as they were."""
    _, state = mixer(prompt)
    conv, ssm = state.conv.clone(), state.ssm.clone()
    mixer.step(token, None, state)
    assert torch.equal(state.conv, conv) and torch.equal(state.ssm, ssm)
