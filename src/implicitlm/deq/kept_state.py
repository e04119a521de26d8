"""The recurrent state a solve leaves behind, kept from the pass whose image it returns.

A map of an implicit recurrence gives two things at once: the image f(z) and the state its
pass reached. The solve returns each sample's best image f(z_k) (``FixedPointSolver``); the
state of that same pass is the one to carry on. Kept as the solve goes, it replaces a
"commit" pass at the solution, which computed both again: one pass more in every
token's 3-10 in sequential mode, and one per chunk or prefilled context in simultaneous mode.
The pair (image, state) then comes from one pass; both are within the tolerance of the
fixed point's, as the commit pass's were.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# rows (None: the whole batch) -> z -> (f(z), the state after the pass), on those rows.
StateMapFn = Callable[[torch.Tensor | None], Callable[[torch.Tensor], tuple[torch.Tensor, Any]]]
SelectRowsFn = Callable[[Any, torch.Tensor], Any]
ReplaceRowsFn = Callable[[Any, torch.Tensor, Any], Any]


class KeptState:
    """``f`` and ``restrict`` for ``FixedPointSolver``, and its ``on_improved``
    callback, which keeps each sample's state from the pass that gave its best image.

    ``select_rows(state, rows)``: those batch rows of a state; ``replace_rows(state, rows,
    new)``: ``state`` with ``rows`` taken from ``new`` (rows of that state, in order)."""

    def __init__(self, state_map: StateMapFn, select_rows: SelectRowsFn, replace_rows: ReplaceRowsFn) -> None:
        self._state_map, self._select, self._replace = state_map, select_rows, replace_rows
        self._whole = state_map(None)
        self.state: Any = None  # per sample, the state of its best pass so far
        self._last: Any = None  # the last pass's state, on ``_last_rows`` (None: the whole batch)
        self._last_rows: torch.Tensor | None = None
        self._batch = 0

    def f(self, z: torch.Tensor) -> torch.Tensor:
        image, self._last = self._whole(z)
        self._last_rows, self._batch = None, z.shape[0]
        return image

    def restrict(self, rows: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        on_rows = self._state_map(rows)

        def f(z: torch.Tensor) -> torch.Tensor:
            image, self._last = on_rows(z)
            self._last_rows = rows
            return image

        return f

    def improved(self, rows: torch.Tensor, better: torch.Tensor | None) -> None:
        """The last pass ran on ``rows`` (or on the whole batch, of which the solver kept
        ``rows``; None: the whole batch, the answer of every row, as a solve of K passes says);
        ``better``: a mask of those whose image improved (None: all of them)."""
        if rows is None:
            self.state = self._last
            return
        whole_pass = self._last_rows is None
        # The first pass runs on every sample. One it did not improve (a NaN image) keeps
        # that pass's state only until a finite image replaces it; with none, the solve raises.
        if self.state is None or (better is None and whole_pass and rows.numel() == self._batch):
            self.state = self._last
            return
        if better is None:
            taken, new = rows, (self._select(self._last, rows) if whole_pass else self._last)
        else:
            positions = better.nonzero().flatten()
            if positions.numel() == 0:
                return
            taken = rows.index_select(0, positions)
            new = self._select(self._last, taken if whole_pass else positions)
        self.state = self._replace(self.state, taken, new)
