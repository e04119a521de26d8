"""A model's learned solver: where its inference solves start (the learned initial guess it
holds, ``deq/initial_guess.py``; none: z = 0), in each mode's form, and the last fixed point a
returned state carries for it; and the learned mixing of the "learned_anderson" solver's steps
(``deq/learned_mixing.py``).

Both live here, not in the model's module tree: each is saved and loaded beside the weights in
a file of its own (not in model.safetensors), which a weight check does not see; they are kept
on the model's device (moved where attached and with the model).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..core.errors import DataError, OptionError
from ..deq import FixedPointOptions, FixedPointSolver, InitialGuess, LearnedMixing
from ..deq.solvers.anderson import MEMORY
from ..deq.initial_guess import GUESS_FILE
from ..deq.learned_mixing import MIXING_FILE
from .errors import ModelLoadError
from .inputs import MODES
from .stack import StackState


class LearnedStart:
    """A model's learned initial guess (``guess``) and learned mixing (``mixing``; None: none
    attached). Attaching, saving and loading take the model, for its options and device; where
    the solves start takes the solver options that say where each mode starts
    (``FixedPointOptions``) and, where it reads states, the model's stack (``StackPasses``,
    which runs the solves, hands them)."""

    def __init__(self) -> None:
        self.guess: InitialGuess | None = None
        self.mixing: LearnedMixing | None = None

    def attach_guess(self, model, guess: InitialGuess | None, use: bool | None) -> None:
        """Keep ``guess`` (None: none) and, with ``use``, start every inference solve of ``model``
        from it (``fixed_point.initial_guess`` "learned"; else "zero", where
        ``initial_guess="learned"`` can turn it on; the per-mode ``simultaneous_initial_guess`` /
        ``sequential_initial_guess`` are cleared). ``use=None`` leaves the options as they are
        (a loaded model: its config says)."""
        self.guess = guess
        self.to(model.device)
        if use is not None:
            model.set_fixed_point_options(initial_guess="learned" if guess is not None and use else "zero",
                                          simultaneous_initial_guess="", sequential_initial_guess="")

    def attach_mixing(self, model, mixing: LearnedMixing | None) -> None:
        """Keep ``mixing`` (None: none), the mixing of every solve of ``model`` by "learned_anderson"."""
        self.mixing = mixing
        self.to(model.device)
        model.set_fixed_point_options()  # the solver rebuilt, with this mixing, where the options are

    def solver(self, options: FixedPointOptions) -> FixedPointSolver:
        """A solver of ``options`` whose "learned_anderson" mixes its steps by the mixing held here."""
        return FixedPointSolver(options, self.mixing)

    def to(self, device: torch.device) -> None:
        """The guess and mixing moved to ``device``, in place (the solver holds the mixing
        itself); never cast: each computes in its own precision."""
        for network in (self.guess, self.mixing):
            if network is not None:
                network.to(device)

    def save(self, folder: str | Path) -> None:
        """Each network attached, in its file beside the weights in ``folder``."""
        for network in (self.guess, self.mixing):
            if network is not None:
                network.save(folder)

    def load(self, model, folder: Path) -> None:
        """The guess and mixing saved in ``folder`` beside an implicit model's weights, loaded,
        checked and attached even where the options do not use them (``initial_guess="learned"``
        or ``solver="learned_anderson"`` may turn them on); one the options use must be there
        (an explicit model uses none). A missing, damaged or mismatched file is a ModelLoadError."""
        if not model.config.implicit:
            return
        options = model.solver.options
        try:
            if any(options.initial_guess_for(mode) == "learned" for mode in MODES) or (folder / GUESS_FILE).is_file():
                self.attach_guess(model, InitialGuess.load(folder, model.config.hidden_size,
                                                           model.stack.readout_sizes()), use=None)
            if any(options.solver_for(mode) == "learned_anderson" for mode in (*MODES, "training")) \
                    or (folder / MIXING_FILE).is_file():
                self.attach_mixing(model, LearnedMixing.load(folder, MEMORY))
        except DataError as error:
            raise ModelLoadError(str(error)) from None

    def first_iterate(self, options: FixedPointOptions, stack, embedded: torch.Tensor,
                      previous: torch.Tensor | None = None, state=None) -> torch.Tensor:
        """Where an inference solve over these tokens starts: the learned guess from each
        token's embedding and, for the first token, the fixed point before it (``previous``)
        and the state the tokens before it left (``state``), where known (the others' are not
        known until the solve ends), or z = 0."""
        guess = self._in_use(options, "simultaneous")
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
        guess = self._in_use(options, "sequential")
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

    def _in_use(self, options: FixedPointOptions, mode: str) -> InitialGuess | None:
        """The learned initial guess, on the model's device, where the options ask for it in
        ``mode``; None: the solves start from z = 0."""
        if options.initial_guess_for(mode) != "learned":
            return None
        if self.guess is None:
            raise OptionError("initial_guess='learned', but this model has no learned initial guess "
                              "(implicitlm solver train makes one)", arguments=("initial_guess",))
        return self.guess


def _first_token_reads(stack, state, length: int):
    """Per-block queries (b, length, width) -> readouts of ``state`` by the first token's,
    zeros for the others (whose states are not known yet)."""
    def read(queries: list[torch.Tensor]) -> list[torch.Tensor]:
        first = stack.read_state(state, [query[:, 0] for query in queries])
        return [torch.cat([read[:, None], read.new_zeros(read.shape[0], length - 1, read.shape[-1])], dim=1)
                for read in first]

    return read
