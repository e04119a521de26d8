"""A decoded token's forward as one CUDA graph: the embedding, every pass of the stack, the head.

At batch 1 a token's passes are hundreds of small kernels whose launches, not their work, take
the time (benchmarks/RESULTS.md, "CUDA"). Captured once and replayed, they cost what the GPU's
work costs. A graph replays fixed memory: the token's ids and the recurrent state live in
buffers the graph reads, and its last kernels write the new state back into them. The state a
graphed forward returns IS those buffers, valid until the next token's forward, as mamba_ssm's
decoding cache is; a state from anywhere else (a prefill, a reordered beam) is copied in first.

Only a token whose work is fixed is captured: an explicit model's one pass, or an implicit
one's K passes (``passes``). A solve to a tolerance decides on the host when to stop, and a
block whose state grows with the tokens (attention's key-value cache) changes shape: both run
eagerly, as without graphs. On a CPU the same buffers run eagerly: what the tests compare with
plain decoding.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..deq import Budget
from .stack import StackState

# Runs before capture, on a side stream, as torch's own ``make_graphed_callables`` does: the
# allocator and any lazily built kernel settle before the graph records their memory.
WARMUP_RUNS = 2
# One graph per (batch, budget, ...): a generation uses one or two; a sweep of many is bounded.
MAX_GRAPHS = 16

# (token ids (b, 1), the state before the token) -> (logits, fixed-point stats, state after it).
TokenForward = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any, Any]]


class TokenGraphs:
    """The token steps of one decoding session, per key (``ImplicitCausalLM.decoding_graphs``).
    ``capture``: record CUDA graphs (a CUDA model); else run the same buffers eagerly."""

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self._steps: dict[tuple, _TokenStep | None] = {}

    def token(self, model, stack_passes, input_ids: torch.Tensor | None, state: Any, budget: Budget):
        """(logits, stats, state) of ``model``'s forward of one token in sequential mode from
        ``state`` within ``budget`` (a ``deq.Budget``) by the call's ``stack_passes`` (those of its
        options), through the step kept for it, where its work is fixed; None: the forward runs as
        usual."""
        if (state is None or input_ids is None or input_ids.shape[1] != 1 or torch.is_grad_enabled()
                or (model.config.implicit and not budget.fixed) or torch.is_autocast_enabled(input_ids.device.type)):
            return None

        def token_forward(ids: torch.Tensor, before: Any):
            embedded = model.embeddings(ids)
            z, stats, after = stack_passes.sequential(embedded, model._injected(embedded), before, budget)
            return model._logits(z), stats, after

        key = (input_ids.shape[0], input_ids.device, model.dtype, budget, stack_passes.solver.options,
               isinstance(state, StackState))
        return self(key, token_forward, input_ids, state)

    def __call__(self, key: tuple, forward: TokenForward, ids: torch.Tensor, state: Any):
        """(logits, stats, state) of ``forward`` at ``ids`` from ``state``, through the step kept
        for ``key`` (everything ``forward`` depends on besides its inputs' values); None where
        the step cannot run from fixed buffers (a state that grows), for the caller to run it."""
        if key not in self._steps:
            if len(self._steps) >= MAX_GRAPHS:
                self._steps.clear()
            self._steps[key] = _TokenStep.built(forward, ids, state, self.capture)
        step = self._steps[key]
        return None if step is None else step(ids, state)


class _TokenStep:
    """One token's forward over fixed buffers: ``ids`` and ``state`` in, the new state written
    back into ``state``; replayed from a CUDA graph where one was captured."""

    def __init__(self, forward: TokenForward, ids: torch.Tensor, state: Any) -> None:
        self.forward = forward
        self.ids = ids.clone()
        self.state = _cloned(state)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple | None = None

    @classmethod
    def built(cls, forward: TokenForward, ids: torch.Tensor, state: Any, capture: bool) -> _TokenStep | None:
        step = cls(forward, ids, state)
        if capture:
            return step if step._captured() else None
        return step if _same_layout(step.forward(step.ids, step.state)[2], step.state) else None

    def __call__(self, ids: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any, Any]:
        self.ids.copy_(ids)
        if state is not self.state:
            _copy_into(self.state, state)
        if self.graph is not None:
            with torch.cuda.device(self.ids.device):
                self.graph.replay()
            logits, stats = self.outputs
        else:
            logits, stats, new_state = self.forward(self.ids, self.state)
            _copy_into(self.state, new_state)
        # The graph's logits are overwritten by the next token; transformers and callers keep them.
        return logits.clone(), stats, self.state

    def _captured(self) -> bool:
        """Capture the forward and its write-back in a graph; False where the state the forward
        returns is not laid out as the one it reads (it grows), which no graph can hold."""
        # On the model's GPU, whichever is the current one (a model on cuda:1).
        with torch.cuda.device(self.ids.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    new_state = self.forward(self.ids, self.state)[2]
                    if not _same_layout(new_state, self.state):
                        return False
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                logits, stats, new_state = self.forward(self.ids, self.state)
                _copy_into(self.state, new_state)
        self.outputs = (logits, stats)
        return True


def _tensors(state: Any) -> list[torch.Tensor | None]:
    """Every tensor of a stack state, in a fixed order: each block state's fields, then the last
    fixed point a ``StackState`` carries (None where a field holds none)."""
    tensors = [getattr(block, field.name) for block in state for field in dataclasses.fields(block)]
    return tensors + ([state.last_fixed_point] if isinstance(state, StackState) else [])


def _cloned(state: Any) -> Any:
    blocks = [dataclasses.replace(block, **{field.name: value.clone() for field in dataclasses.fields(block)
                                            if isinstance(value := getattr(block, field.name), torch.Tensor)})
              for block in state]
    return StackState(blocks, state.last_fixed_point.clone()) if isinstance(state, StackState) else blocks


def _same_layout(state: Any, buffers: Any) -> bool:
    new, kept = _tensors(state), _tensors(buffers)
    return len(new) == len(kept) and all(
        (a is None) == (b is None) and (a is None or (a.shape == b.shape and a.dtype == b.dtype))
        for a, b in zip(new, kept))


def _copy_into(buffers: Any, state: Any) -> None:
    for buffer, value in zip(_tensors(buffers), _tensors(state)):
        if buffer is not None:
            buffer.copy_(value)
