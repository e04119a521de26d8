"""Where an implicit model's inference solves start: the learned initial guess it holds
(``deq/initial_guess.py``; none: z = 0), in each mode's form, and the last fixed point a
returned state carries for it.

The guess lives here, not in the model's module tree: it is saved and loaded beside the
weights in a file of its own (not in model.safetensors), and a weight check or ``to()`` of the
model does not see it, so it is moved to the model's device where it is used.
"""

from __future__ import annotations

import functools

import torch

from ..core.errors import OptionError
from ..deq import FixedPointOptions, InitialGuess
from .inputs import MODES
from .stack import StackState


class LearnedStart:
    """A model's learned initial guess (``guess``; None: none attached). Each method takes the
    solver options that say where each mode starts (``FixedPointOptions``) and, where it reads
    states, the model's stack (``StackPasses``, which runs the solves, hands them)."""

    def __init__(self) -> None:
        self.guess: InitialGuess | None = None

    def first_iterate(self, options: FixedPointOptions, stack, embedded: torch.Tensor,
                      previous: torch.Tensor | None = None, state=None) -> torch.Tensor:
        """Where an inference solve over these tokens starts: the learned guess from each
        token's embedding and, for the first token, the fixed point before it (``previous``)
        and the state the tokens before it left (``state``), where known (the others' are not
        known until the solve ends), or z = 0."""
        guess = self._in_use(options, "simultaneous", embedded.device)
        if guess is None:
            return torch.zeros_like(embedded)
        known = None
        if previous is not None:
            known = torch.zeros_like(embedded)
            known[:, 0] = previous
        reads = _first_token_reads(stack, state, embedded.shape[1]) if guess.reads_state and state is not None \
            else None
        return guess(embedded, known, reads)

    def token_guess(self, options: FixedPointOptions, stack, embedded: torch.Tensor,
                    first_previous: torch.Tensor | None):
        """(t, the previous token's fixed point, the state before token t) -> token t's first
        iterate in sequential mode; None: z = 0. ``first_previous``: the fixed point before the
        first token, where it is known."""
        guess = self._in_use(options, "sequential", embedded.device)
        if guess is None:
            return None
        reads_state = guess.reads_state

        def start(t: int, previous: torch.Tensor | None, state) -> torch.Tensor:
            # A guess that does not read the state gets no reader: nothing is bound per token for it.
            read = functools.partial(stack.read_state, state) if reads_state else None
            return guess(embedded[:, t], first_previous if previous is None else previous, read)

        return start

    def with_last_fixed_point(self, options: FixedPointOptions, state: list | None, z: torch.Tensor) -> list | None:
        """``state`` after an implicit model's fixed points ``z``, and where a learned guess starts
        the solves, the last token's fixed point with it (``StackState``): the next call's first
        token starts from a guess that reads it."""
        if state is None or all(options.initial_guess_for(mode) != "learned" for mode in MODES):
            return state
        return StackState(state, last_fixed_point=z[:, -1].detach())

    def _in_use(self, options: FixedPointOptions, mode: str, device: torch.device) -> InitialGuess | None:
        """The learned initial guess, on ``device`` (the tokens'), where the options ask for it in
        ``mode``; None: the solves start from z = 0."""
        if options.initial_guess_for(mode) != "learned":
            return None
        if self.guess is None:
            raise OptionError("initial_guess='learned', but this model has no learned initial guess "
                              "(implicitlm solver train makes one)", arguments=("initial_guess",))
        # Moved only where it is elsewhere: a module's ``to`` walks its parameters, at every token.
        return self.guess if self.guess.out.weight.device == device else self.guess.to(device)


def _first_token_reads(stack, state, length: int):
    """Per-block queries (b, length, width) -> readouts of ``state`` by the first token's,
    zeros for the others (whose states are not known yet)."""
    def read(queries: list[torch.Tensor]) -> list[torch.Tensor]:
        first = stack.read_state(state, [query[:, 0] for query in queries])
        return [torch.cat([read[:, None], read.new_zeros(read.shape[0], length - 1, read.shape[-1])], dim=1)
                for read in first]

    return read
