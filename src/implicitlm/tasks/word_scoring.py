"""Scoring a model on word problems: per-token accuracy (and last-10 accuracy) in either
inference mode, read in windows of the words that carry each word's state from one window to
the next, so an evaluation at any length runs in bounded memory; and that memory and its time, estimated."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.duration import seconds_of
from ..core.errors import OptionError
from ..core.memory import activation_bytes, peak_growth, return_freed_memory, tensor_bytes
from ..data.words import StoredWords, WordWindows
from ..deq import ConvergenceTally, FixedPointStats, chain_chunks, warn_not_converged
from ..deq.options import MAX_PASSES
from ..models.implicit_lm import MODES
from .base import one_forward

# Simultaneous mode carries a token's state about one position further per iteration, so
# a word's fixed point takes about as many iterations as it has tokens; the slowest words
# of a trained S3 model took up to 1.5 times that (186 on average at 128 tokens, up to
# 250), hence twice the length plus a margin.
SIMULTANEOUS_BUDGET_PER_TOKEN = 2
SIMULTANEOUS_BUDGET_MARGIN = 32


def simultaneous_budget(model, length: int, fixed_point: dict[str, Any] | None = None) -> int:
    """The evaluation budget of a simultaneous solve over words of ``length`` tokens given
    ``fixed_point`` (``forward``'s argument): the options' own, or twice the length plus a margin
    where that is more; a model that solves in chunks (``chunk_length``) needs that for a
    chunk's length only. Converged words stop early, so a generous budget costs only where it
    is needed."""
    return max(
        model.fixed_point_options(fixed_point).max_iter,
        SIMULTANEOUS_BUDGET_PER_TOKEN * solved_at_once(model, length, fixed_point) + SIMULTANEOUS_BUDGET_MARGIN,
    )


def with_word_budget(model, longest: int, fixed_point: dict[str, Any] | None = None) -> dict[str, Any]:
    """``fixed_point`` with the budget that an implicit model's simultaneous solves over words of
    ``longest`` tokens need (``simultaneous_budget``) as its ``simultaneous_max_iter``: the
    model's own ``max_iter`` may be a training length's."""
    fixed_point = dict(fixed_point or {})
    if model.config.implicit:
        # Held to the solver's limit: words that need more are refused by the memory check first.
        fixed_point["simultaneous_max_iter"] = min(simultaneous_budget(model, longest, fixed_point), MAX_PASSES)
    return fixed_point


def solved_at_once(model, length: int, fixed_point: dict[str, Any] | None = None) -> int:
    """How many tokens of a ``length``-token word one simultaneous solve given ``fixed_point``
    takes: a chunk's worth."""
    return min(length, model.fixed_point_options(fixed_point).chunk_length or length)


# Tokens one forward of a word evaluation reads (words per batch times positions per window):
# a window's tensors stay this size however long the words.
WINDOW_TOKENS = 2**16


# What the evaluation holds per position of a batch's window besides the forward: the tokens
# and labels as int64, the predictions, and whether each is right.
PER_POSITION_BYTES = 8 + 8 + 8 + 1


def evaluation_window(model, modes: tuple[str, ...], length: int, rows: int,
                      fixed_point: dict[str, Any] | None = None) -> int:
    """Positions of a ``length``-token word that one forward of ``rows`` words reads in each of
    ``modes``, the state carried from window to window. A simultaneous solve in chunks reads
    whole chunks (windows are counted back from the end, as the chunks are, so the answers
    are those of one forward over the whole words); one over the whole sequence
    (``chunk_length`` 0) reads all of it. ``fixed_point``: the forwards' (``forward``'s argument)."""
    if "simultaneous" in modes and model.config.implicit:
        chunk = solved_at_once(model, length, fixed_point)
        return min(length, chunk * max(1, WINDOW_TOKENS // (rows * chunk)))
    return min(length, max(1, WINDOW_TOKENS // rows))


def window_bounds(length: int, window: int) -> list[int]:
    """The positions where windows of ``window`` tokens start, counted back from the end (the
    first window is the partial one), and the length."""
    return [0, *range(length % window or window, length + 1, window)]


def word_accuracy(model, inputs: np.ndarray | WordWindows, targets: np.ndarray | None = None,
                  mode: str = "simultaneous", **options: Any) -> dict[str, Any]:
    """``prefix_accuracy``'s one row at the words' whole length (``options``: its own)."""
    return prefix_accuracy(model, inputs, targets, (), mode, **options)[0]


def prefix_accuracy(
    model,
    inputs: np.ndarray | WordWindows,
    targets: np.ndarray | None = None,
    prefixes: Sequence[int] = (),
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 256,
    last: int = 10,
    warn: bool = True,
    progress: bool = False,
    fixed_point: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """A row per length of ``prefixes`` (shorter than the words), then the words' own, each
    scoring the words' first that many tokens, read once: the rows an evaluation of each
    prefix alone gives, at the cost of the longest. A chunked simultaneous solve reads whole
    chunks counted back from a word's end, so a prefix must end on a chunk boundary of the
    whole word (``prefix_cuts``).

    A row: per-token accuracy over the last ``last`` tokens of each word (the authors' metric)
    and over all tokens but the first, whose label is its own input (a model that copies it
    would score 1 / length for free); for implicit models, the mean passes per fixed point and
    how many fixed points stopped above the tolerance, and why. The words: ``inputs`` and
    ``targets`` (arrays), or a ``WordWindows`` set, read a window at a time
    (``evaluation_window``) in memory that does not grow with their length.

    Budget: ``max_iter`` / ``tol`` if given, else the options' for ``mode``: the model's
    changed by ``fixed_point``, every forward's (a simultaneous solve over words longer than
    the model's budget needs ``simultaneous_budget``: the words task gives it as
    ``simultaneous_max_iter``, ``with_word_budget``).
    ``warn``: log a one-line warning when fixed points stopped above the tolerance (a
    budget sweep, which shows the share itself, turns it off); ``progress``: a bar over the
    windows."""
    words = _word_windows(inputs, targets)
    cuts = prefix_cuts(model, mode, words.length, prefixes, fixed_point)
    score = WordScore(model, mode, max_iter, tol, words.length, last, fixed_point)
    _read_in_windows(model, words, batch_size, [score], progress=progress, cuts=cuts)
    return score.rows(warn)


def prefix_cuts(model, mode: str, length: int, prefixes: Sequence[int],
                fixed_point: dict[str, Any] | None = None) -> tuple[int, ...]:
    """``prefixes`` sorted, each checked to be scored as its own evaluation would score it:
    shorter than the words, of at least 2 tokens, and ending where a chunk of an implicit
    model's simultaneous solve ends (a solve of the whole sequence at once has no such
    point: its every iterate reads all of it)."""
    cuts = tuple(sorted(set(prefixes)))
    if any(cut < 2 or cut >= length for cut in cuts):
        raise OptionError(f"prefixes {list(cuts)} of {length}-token words: each must be at least 2 and shorter than the words")
    if cuts and mode == "simultaneous" and model.config.implicit:
        chunk = model.fixed_point_options(fixed_point).chunk_length
        if not chunk:
            raise OptionError("prefixes need a chunked simultaneous solve (chunk_length > 0) or sequential mode: a solve "
                              "of the whole word reads every token at every pass", arguments=("chunk_length",))
        off = [cut for cut in cuts if (length - cut) % chunk]
        if off:
            raise OptionError(f"prefixes {off} of {length}-token words do not end on a chunk boundary: chunks of {chunk} "
                              f"tokens are counted back from the words' end; give lengths that differ from the "
                              f"longest by multiples of {chunk}", arguments=("lengths",))
    return cuts


def mode_agreement(
    model,
    inputs: np.ndarray,
    targets: np.ndarray,
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 256,
    fixed_point: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The duality check: both inference modes of an implicit model on the same words.

    ``argmax_agreement``: the share of tokens whose predicted label is the same in
    simultaneous and in sequential (RNN) mode; ``simultaneous`` / ``sequential``: each
    mode's ``word_accuracy`` row. ``max_iter``: the budget of both (default: each mode's own);
    ``fixed_point``: every forward's."""
    words = _word_windows(inputs, targets)
    scores = [WordScore(model, mode, max_iter, tol, words.length, fixed_point=fixed_point) for mode in MODES]
    agreeing = 0

    def compare(predictions: list[torch.Tensor], *_) -> None:
        nonlocal agreeing
        agreeing += int((predictions[0] == predictions[1]).sum())

    _read_in_windows(model, words, batch_size, scores, compare)
    rows = {score.mode: score.rows()[-1] for score in scores}
    agreement = agreeing / (words.count * words.length)
    return {"length": words.length, "sequences": words.count, "argmax_agreement": agreement, **rows}


def word_predictions(
    model, inputs, targets, mode: str, max_iter, tol, batch_size: int, last: int = 10, warn: bool = True,
    fixed_point: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(predicted labels (N, L), ``word_accuracy``'s row): the predictions too, for
    comparisons between solves (they take memory in proportion to the words)."""
    words = _word_windows(inputs, targets)
    predicted = torch.empty(words.count, words.length, dtype=torch.long)
    score = WordScore(model, mode, max_iter, tol, words.length, last, fixed_point)

    def keep(predictions: list[torch.Tensor], rows: slice, positions: slice) -> None:
        predicted[rows, positions] = predictions[0]

    _read_in_windows(model, words, batch_size, [score], keep)
    return predicted, score.rows(warn)[-1]


def _word_windows(inputs: np.ndarray | WordWindows, targets: np.ndarray | None) -> WordWindows:
    return inputs if isinstance(inputs, WordWindows) else StoredWords(inputs, targets)


class WordScore:
    """One inference mode's running score on a word set read window by window: the state
    each batch's words carry to their next window, their fixed-point stats chained over the
    windows (simultaneous mode: a word's fixed point is all its windows' chunks together, as
    in one forward over the whole word) or summed (sequential mode: one per token), and the
    hits at each position; what they were at the end of each prefix read (``close_prefix``)."""

    def __init__(self, model, mode: str, max_iter: int | None, tol: float | None, length: int, last: int = 10,
                 fixed_point: dict[str, Any] | None = None):
        if length < 2:
            raise OptionError("word accuracy needs words of at least 2 tokens: token 1's label is its input")
        self.model, self.mode, self.max_iter, self.tol, self.length, self.last = model, mode, max_iter, tol, length, last
        self.fixed_point = fixed_point
        self.states: dict[int, Any] = {}
        self.chained: dict[int, FixedPointStats] = {}
        self.solves = SolveCounts()
        self.prefixes: dict[int, SolveCounts] = {}
        self.position_hits = np.zeros(length, dtype=np.int64)
        self.words = 0

    def read(self, batch: int, tokens: torch.Tensor, labels: torch.Tensor, start: int, more: bool) -> torch.Tensor:
        """The predicted labels of batch ``batch``'s words at positions ``start`` on (their
        ``tokens``), counted against ``labels``; ``more``: a window of these words follows."""
        carried = {} if batch not in self.states else {"state": self.states.pop(batch)}
        if more:
            carried["use_cache"] = True
        output = self.model(tokens, mode=self.mode, max_iter=self.max_iter, tol=self.tol, fixed_point=self.fixed_point,
                            **carried)
        if more:
            # Copied: a state read off a forward may be a view that keeps its whole window's tensors alive.
            self.states[batch] = self.model.stack.select_state(output.state, torch.arange(tokens.shape[0], device=tokens.device))
        predicted = output.logits.argmax(-1).cpu()
        self.position_hits[start:start + tokens.shape[1]] += (predicted == labels).sum(0).numpy()
        if start == 0:
            self.words += tokens.shape[0]
        stats = output.fixed_point
        if stats is not None and self.mode == "simultaneous":
            earlier = self.chained.pop(batch, None)
            stats = stats if earlier is None else chain_chunks([earlier, stats])
            if more:
                self.chained[batch] = stats
        if stats is not None and not (self.mode == "simultaneous" and more):
            self.solves.add(stats)
        return predicted

    def close_prefix(self, length: int) -> None:
        """Keep the solves of the words' first ``length`` tokens, once every batch read them:
        the sequential ones so far, or each word's simultaneous ones chained so far."""
        if self.mode == "simultaneous":
            solves = SolveCounts()
            for stats in self.chained.values():
                solves.add(stats)
        else:
            solves = copy.deepcopy(self.solves)
        self.prefixes[length] = solves

    def rows(self, warn: bool = True) -> list[dict[str, Any]]:
        """``prefix_accuracy``'s rows, once every window of every word was read."""
        ends = {**self.prefixes, self.length: self.solves}
        return [self._row(length, solves, warn) for length, solves in sorted(ends.items())]

    def _row(self, length: int, solves: SolveCounts, warn: bool) -> dict[str, Any]:
        last = min(self.last, length - 1)
        row: dict[str, Any] = {
            "length": length,
            "sequences": self.words,
            f"accuracy_last{self.last}": int(self.position_hits[length - last:length].sum()) / (self.words * last),
            "accuracy": int(self.position_hits[1:length].sum()) / (self.words * (length - 1)),
        }
        if solves.tally.fixed_points:
            options = self.model.fixed_point_options(self.fixed_point)
            if solves.tally.in_passes:
                row["passes"] = options.passes  # no max_iter nor tol: a fixed budget holds none
            else:
                row["max_iter"], row["tol"] = options.budget(self.max_iter, self.tol, self.mode)
            if self.mode == "simultaneous":
                row["chunk_length"] = solved_at_once(self.model, length, self.fixed_point)
            row["fp_passes_mean"] = solves.passes / solves.tally.fixed_points
            row["fp_rel_residual_mean"] = solves.rel_residual / solves.tally.fixed_points
            row.update(solves.tally.as_dict())
            if warn:
                warn_not_converged(solves.tally, f"{self.mode} mode, length {length}")
        return row


@dataclasses.dataclass
class SolveCounts:
    """What a score's solves came to: their tally, and their passes and relative residuals summed."""

    tally: ConvergenceTally = dataclasses.field(default_factory=ConvergenceTally)
    passes: float = 0.0
    rel_residual: float = 0.0

    def add(self, stats: FixedPointStats) -> None:
        self.tally.add(stats)
        self.passes += float(stats.passes.double().sum())
        self.rel_residual += float(stats.rel_residual.double().sum())


def _read_in_windows(model, words: WordWindows, batch_size: int, scores: list[WordScore], on_read=None,
                     progress: bool = False, cuts: tuple[int, ...] = ()) -> None:
    """Every window of ``words`` read by each of ``scores`` (modes), batch by batch: windows
    outside, so that a window's tokens are drawn or read once. ``on_read(predictions,
    rows, positions)``: each batch's predictions of each score, as they are made. ``cuts``:
    prefix lengths where a window ends and each score closes the prefix."""
    rows = min(batch_size, words.count)
    window = evaluation_window(model, tuple(score.mode for score in scores), words.length, rows, scores[0].fixed_point)
    bounds = sorted({*window_bounds(words.length, window), *cuts})
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for start, end in tqdm(list(zip(bounds, bounds[1:])), desc="windows", disable=not progress or len(bounds) < 3):
            return_freed_memory()
            tokens, labels = words.window(start, end)
            for batch, first in enumerate(range(0, words.count, batch_size)):
                part = slice(first, first + batch_size)
                x = torch.from_numpy(tokens[part].astype(np.int64)).to(device)
                y = torch.from_numpy(labels[part].astype(np.int64))
                predictions = [score.read(batch, x, y, start, end < words.length) for score in scores]
                if on_read is not None:
                    on_read(predictions, part, slice(start, end))
            if end in cuts:
                for score in scores:
                    score.close_prefix(end)


def evaluation_bytes(model, words: WordWindows, mode: str, batch_size: int,
                     fixed_point: dict[str, Any] | None = None) -> int:
    """The peak memory ``word_accuracy`` takes on ``words`` beyond the model, every forward given
    ``fixed_point``: what the words hold (``held_bytes``) and one forward's tensors over a
    batch's window."""
    rows = min(batch_size, words.count)
    window = evaluation_window(model, (mode,), words.length, rows, fixed_point)
    return (held_bytes(model, words, mode, batch_size, fixed_point)
            + forward_bytes(model, mode, rows, window, words.length, fixed_point))


def held_bytes(model, words: WordWindows, mode: str, batch_size: int, fixed_point: dict[str, Any] | None = None) -> int:
    """What ``word_accuracy`` holds of ``words`` besides a forward, from their sizes alone (no
    forward: a size no memory holds is refused before one is probed): a window of every
    word's tokens and labels (and the tile they are drawn from), and the state every word
    carries between windows."""
    window = evaluation_window(model, (mode,), words.length, min(batch_size, words.count), fixed_point)
    tokens = 2 * words.count * window * words.token_bytes + getattr(words, "tile_bytes", 0)
    carried = words.count * carried_state_bytes(model, words.length) if window < words.length else 0
    return tokens + carried


def carried_state_bytes(model, length: int) -> int:
    """What one word's state takes after ``length`` tokens, read off the stack's state after
    one token and after two: a recurrence's does not grow, attention's cache grows by a
    token's keys and values."""
    config = model.config
    parameter = next(model.parameters())
    hidden = torch.zeros((1, 2, config.hidden_size), device=parameter.device, dtype=parameter.dtype)
    with torch.no_grad():
        injection = model.injection(hidden) if config.implicit else None
        sizes = [tensor_bytes(model.stack(hidden[:, :t], None if injection is None else injection[:, :t])[1]) for t in (1, 2)]
    return sizes[0] + (sizes[1] - sizes[0]) * (length - 1)


def forward_bytes(model, mode: str, rows: int, window: int, length: int, fixed_point: dict[str, Any] | None = None) -> int:
    """One forward's working set over a batch's window, measured: the peak of a forward over a
    batch's window (at most ``WINDOW_TOKENS`` positions of it, whole chunks, scaled to the
    window), at one fixed-point iteration, whose memory later ones reuse. Measured at the
    evaluation's own sizes: the allocator keeps or returns memory by the size of a request,
    so a smaller probe scaled up is off by as much as twice. Scaled linearly beyond the probe,
    as a recurrence grows (attention's scores do not: a whole-sequence solve of an attention
    model beyond the probe is estimated low)."""
    config = model.config
    # Whole chunks; a whole-sequence solve (one chunk the length of the words) at the probe's length.
    chunk = solved_at_once(model, length, fixed_point) if mode == "simultaneous" and config.implicit else 1
    unit = max(1, min(chunk, WINDOW_TOKENS // rows))
    positions = min(window, unit * max(1, WINDOW_TOKENS // (rows * unit)))
    probe = one_forward(model, mode, rows, positions, window < length, fixed_point)
    measured = peak_growth(probe, next(model.parameters()).device)
    if measured is None:
        return activation_bytes(rows, window, config.hidden_size, config.num_hidden_layers)
    return int(window / positions * measured) + rows * window * PER_POSITION_BYTES


def evaluation_seconds(model, words: WordWindows, mode: str, batch_size: int, one_solve: bool = False,
                       fixed_point: dict[str, Any] | None = None) -> float:
    """A lower bound on the time ``word_accuracy`` takes on ``words``, every forward given
    ``fixed_point``: one forward over a batch's window, timed at one fixed-point iteration, for
    every batch of every window.
    ``one_solve``: a looser bound, in a fraction of the time: a forward over the positions of
    one of the solves a window's forward makes one after another (a chunk of a simultaneous
    solve, a token in sequential mode), timed, for each of them."""
    rows = min(batch_size, words.count)
    window = evaluation_window(model, (mode,), words.length, rows, fixed_point)
    positions = min(window, _solved_together(model, mode, words.length, fixed_point)) if one_solve else window
    probe = one_forward(model, mode, rows, positions, window < words.length, fixed_point)
    if one_solve:
        probe()  # the first forward pays for setting up the kernels, which the count below would multiply
    seconds = seconds_of(probe) * (window // positions)
    return seconds * -(-words.count // batch_size) * -(-words.length // window)


def _solved_together(model, mode: str, length: int, fixed_point: dict[str, Any] | None) -> int:
    """The positions of a ``length``-token word that one step of a forward reads at once: a
    token in sequential mode, a chunk in an implicit model's simultaneous mode, all of them in
    an explicit model's."""
    if mode == "sequential":
        return 1
    return solved_at_once(model, length, fixed_point) if model.config.implicit else length
