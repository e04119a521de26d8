"""The backbone map f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u)), shared by all families.

A block provides ``forward(z, u, state)``, ``step(z_t, u_t, state)`` and
``initial_state(batch, ...)``; the stack threads one state per block through them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from ..core.errors import OptionError
from ..layers import RMSNorm
from .configuration import ImplicitLMConfig


class StackState(list):
    """The per-block states, and the fixed point of the last token they have read: what a
    learned initial guess reads for the next token (``models/learned_solver.py``). A state
    rebuilt from its rows (``select_state``, a beam's reordering) is a plain list again,
    whose next token's guess then reads no previous fixed point."""

    def __init__(self, states: list[Any], last_fixed_point: torch.Tensor) -> None:
        super().__init__(states)
        self.last_fixed_point = last_fixed_point


class BlockStack(nn.Module):
    """The same object serves explicit and implicit models; implicit ones get weight norm."""

    def __init__(self, block_class: type[nn.Module], config: ImplicitLMConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(block_class(config) for _ in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        # Set through the model's ``activation_checkpointing_enable()`` (transformers).
        self.gradient_checkpointing = False
        if config.implicit and config.weight_norm:
            apply_weight_norm(self)

    def initial_state(self, batch: int, device=None, dtype=None) -> list[Any]:
        return [layer.initial_state(batch, device, dtype) for layer in self.layers]

    def check_state(self, states: Any, batch: int) -> None:
        """``states`` (a forward's ``state`` argument) as a previous output's ``state`` holds
        them: one block state per block, each of ``batch`` rows."""
        blocks = len(self.layers)
        if not isinstance(states, list) or len(states) != blocks:
            found = f"{len(states)} items" if isinstance(states, list) else type(states).__name__
            raise OptionError(f"state must be a previous output's state, a list of {blocks} block states; got {found}")
        rows = [_state_rows(state) for state in states]
        if None in rows:
            index = rows.index(None)
            raise OptionError(f"state[{index}] must be a block state of a previous output; got {type(states[index]).__name__}")
        if set(rows) != {batch}:
            raise OptionError(f"state holds {', '.join(map(str, sorted(set(rows))))} rows; the input has {batch}")
        for index, (state, expected) in enumerate(zip(states, self._state_layouts)):
            if not _fits(_layout(state), expected):
                raise OptionError(f"state[{index}] is not a state of this model's blocks (another model's, of another "
                                  f"width or family?): got {_described(_layout(state))}, expected {_described(expected)}")

    @functools.cached_property
    def _state_layouts(self) -> list[tuple]:
        """Per block, its initial state's ``_layout``, read once: building it for every decoded
        token's check would cost a tenth of a small model's step."""
        return [_layout(layer.initial_state(1, device="meta", dtype=torch.float32)) for layer in self.layers]

    def select_state(self, states: list[Any], index: torch.Tensor) -> list[Any]:
        """The states of batch rows ``index``, in that order (every state tensor is batch-first)."""
        return [_select_rows(state, index) for state in states]

    def replace_state_rows(self, states: list[Any], index: torch.Tensor, rows: list[Any]) -> list[Any]:
        """``states`` with batch rows ``index`` taken from ``rows`` (the states of those rows,
        as ``select_state`` gives them, after the same tokens)."""
        return [_replace_rows(state, index, new) for state, new in zip(states, rows)]

    def forward(
        self,
        z: torch.Tensor,
        injection: torch.Tensor | None,
        states: list[Any] | None = None,
        padding: torch.Tensor | None = None,
        hidden_states: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[Any]]:
        """``padding``: (b, l) bool, True at real tokens; padding tokens leave no trace in
        the state, so left padding does not change the real tokens' outputs.
        ``hidden_states``: a list that receives every block's input and then the output,
        transformers' layout (N + 1 entries for N blocks)."""
        new_states = []
        recompute = self.gradient_checkpointing and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            state = None if states is None else states[i]
            if hidden_states is not None:
                hidden_states.append(z)
            if recompute:
                # Only each block's input is kept; its activations are recomputed in the
                # backward pass, trading one more forward for most of the memory.
                z, state = self._gradient_checkpointing_func(layer.__call__, z, injection, state, padding)
            else:
                z, state = layer(z, injection, state, padding)
            new_states.append(state)
        z = self.norm_f(z)
        if hidden_states is not None:
            hidden_states.append(z)
        return z, new_states

    def readout_sizes(self) -> list[tuple[int, int]]:
        """Per block, the (query, readout) widths with which a learned initial guess reads its
        state (``read_state``)."""
        return [layer.readout_sizes for layer in self.layers]

    def read_state(self, states: list[Any], queries: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each block's state read by its query (b, query width): what the tokens before the
        next one left there, as a learned initial guess sees it."""
        return [layer.read_state(state, query) for layer, state, query in zip(self.layers, states, queries)]

    def state_reader(self, z: torch.Tensor, injection: torch.Tensor | None, states: list[Any] | None = None,
                     padding: torch.Tensor | None = None):
        """Per-block queries (b, l, query width) -> per-block ``read_state`` before every token,
        of the states a pass at ``z`` leaves (at a fixed point z*, those of the model's answer):
        what a learned initial guess is fitted on, for all tokens at once."""
        readers = []
        for i, layer in enumerate(self.layers):
            state = None if states is None else states[i]
            readers.append(layer.state_reader(z, injection, state, padding))
            if i + 1 < len(self.layers):
                z, _ = layer(z, injection, state, padding)
        return lambda queries: [read(query) for read, query in zip(readers, queries)]

    def step(
        self, z: torch.Tensor, injection: torch.Tensor | None, states: list[Any]
    ) -> tuple[torch.Tensor, list[Any]]:
        new_states = []
        for layer, state in zip(self.layers, states):
            z, state = layer.step(z, injection, state)
            new_states.append(state)
        return self.norm_f(z), new_states


def _state_rows(state: Any) -> int | None:
    """The batch size of a block state (every state tensor is batch-first); None: not one."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        return None
    values = (getattr(state, field.name) for field in dataclasses.fields(state))
    return next((value.shape[0] for value in values if isinstance(value, torch.Tensor) and value.dim() > 0), None)


def _layout(state: Any) -> tuple:
    """A block state's type, and per field the sizes of its tensor past the batch (None: no tensor)."""
    return type(state), tuple((field.name, tuple(value.shape[1:]) if isinstance(value := getattr(state, field.name),
                                                                              torch.Tensor) else None)
                              for field in dataclasses.fields(state))


def _fits(layout: tuple, expected: tuple) -> bool:
    """Whether a state's ``_layout`` is that of a block's initial state, ``expected``: where that
    holds no tensor (a cache's padding mask) or a size of 0 (the tokens a cache has read), any."""
    (kind, sizes), (expected_kind, expected_sizes) = layout, expected
    if kind is not expected_kind:
        return False
    return all(wanted is None or (found is not None and len(found) == len(wanted)
                                  and all(size in (0, other) for size, other in zip(wanted, found)))
               for (_, found), (_, wanted) in zip(sizes, expected_sizes))


def _described(layout: tuple) -> str:
    kind, sizes = layout
    return f"{kind.__name__}({', '.join(f'{name} {size}' for name, size in sizes if size is not None)})"


def _select_rows(state: Any, index: torch.Tensor) -> Any:
    rows = {}
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if value is not None:
            rows[field.name] = value.index_select(0, index)
    return dataclasses.replace(state, **rows)


def _replace_rows(state: Any, index: torch.Tensor, new: Any) -> Any:
    rows = {}
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if value is not None:
            rows[field.name] = value.index_copy(0, index, getattr(new, field.name))
    return dataclasses.replace(state, **rows)


def apply_weight_norm(stack: nn.Module) -> None:
    # torch's parametrisation rather than torchdeq's weight norm: torchdeq caches the
    # normalised weight as a plain attribute that goes stale (and holds a freed graph)
    # unless reset after every optimiser step; the parametrisation recomputes it, once per
    # forward under ``parametrize.cached()``.
    for module in list(stack.modules()):
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            weight_norm(module, name="weight", dim=0)
