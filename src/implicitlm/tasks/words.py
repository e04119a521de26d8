"""Word problems (state tracking) as a task: training batches (fresh words or a word file, each
process its own rows), test words of each length, generated or read from files, scored by
per-token accuracy in either inference mode, by length, with the ``word_length`` record and its
figure; the hard tokens of a product group's words split a convergence report."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.duration import require_time
from ..core.errors import DataError, OptionError
from ..core.memory import require
from ..data.groups import get_group
from ..data.word_storage import load_words
from ..data.words import GeneratedWords, StoredWords, WordData, WordWindows, generate_words, hard_token_mask
from . import TASKS
from .base import Figure, Task, TaskRecord, missed_cell, missed_header, retries_cell
from .word_scoring import (
    evaluation_bytes, evaluation_seconds, held_bytes, mode_agreement, prefix_accuracy, with_word_budget, word_accuracy,
)

# Test words come from seeds far from any training step's seed sequence.
TEST_SEED_OFFSET = 1_000_000_007


def held_out_words(group: str, length: int, count: int, seed: int = 0, hard_prob: float | None = None):
    """(inputs, targets) of fresh test words, seeded far from any training step's seeds."""
    return held_out_word_windows(group, length, count, seed, hard_prob).arrays()


def held_out_word_windows(group: str, length: int, count: int, seed: int = 0, hard_prob: float | None = None) -> GeneratedWords:
    """``held_out_words``, drawn a window at a time as an evaluation reads them."""
    return GeneratedWords(group, length, count, seed=TEST_SEED_OFFSET + seed, hard_prob=hard_prob)


# How a refusal of words that take too long names what to change.
TOO_LONG = {"arguments": ("lengths", "count"), "hint": "; give shorter lengths or a smaller count"}
# Generated words per length unless --count says otherwise: for accuracy, for a convergence report.
COUNT, CONVERGENCE_COUNT = 512, 64
ACCURACY_AXES = {"x": "test sequence length", "y": "accuracy, last 10 tokens", "xscale": "log2"}


def accuracy_by_length(
    model,
    group: str,
    lengths: Iterable[int],
    count: int = COUNT,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    **kwargs,
) -> list[dict[str, Any]]:
    """``word_accuracy`` on fresh test words of each length."""
    return _by_length(word_accuracy, model, group, lengths, count, seed, hard_prob, progress, "eval", **kwargs)


def agreement_by_length(
    model,
    group: str,
    lengths: Iterable[int],
    count: int = 64,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    **budget,
) -> list[dict[str, Any]]:
    """``mode_agreement`` on fresh test words of each length."""
    return _by_length(mode_agreement, model, group, lengths, count, seed, hard_prob, progress, "duality", **budget)


def _by_length(evaluate, model, group, lengths, count, seed, hard_prob, progress, desc, **kwargs):
    return [
        evaluate(model, *held_out_words(group, length, count, seed, hard_prob), **kwargs)
        for length in tqdm(list(lengths), desc=desc, disable=not progress)
    ]


def accuracy_figure(curves: dict[str, list[dict[str, Any]]], group: str, title: str, train_length: int | None) -> Figure:
    """A line per label of ``curves`` (rows of ``word_accuracy``): accuracy over each word's
    last 10 tokens against test length, the training length and chance marked."""
    series = [
        {"label": label, "x": [row["length"] for row in rows], "y": [row["accuracy_last10"] for row in rows]}
        for label, rows in curves.items()
    ]
    return Figure(
        "curves", title, series, dict(ACCURACY_AXES), vertical={"training length": train_length} if train_length else {},
        horizontal={"chance": 1.0 / get_group(group).order}, ylim=(0, 1.02),
    )


def word_length_record(rows: list[dict[str, Any]], group: str, mode: str, train_length: int | None) -> TaskRecord:
    """The ``word_length`` record of ``rows`` (``word_accuracy``'s, one per test length) in
    ``mode``: accuracy by length, over each word's last 10 tokens and over all but the first."""
    metrics = {f"accuracy_last10@{row['length']}": row["accuracy_last10"] for row in rows}
    metrics.update({f"accuracy@{row['length']}": row["accuracy"] for row in rows})
    figure = accuracy_figure({f"{mode} mode": rows}, group, f"{group} word problem: accuracy by length", train_length)
    details = {"group": group, "mode": mode, "train_length": train_length, "rows": rows}
    return TaskRecord(WordsTask.experiment, metrics, figure, figure.series, figure.axes, details)


class WordsTask(Task):
    """Word problems over the checkpoint's group (or ``group``, which must be the same): fresh
    test words of ``lengths`` (or ``multiples`` of the training length), ``count`` per length
    from ``seed``, or the words of the ``data`` files; rows are ``word_accuracy``'s. ``prefixes``:
    a length evaluation draws the longest length's words only and scores every length on
    their prefixes, in one read (``prefix_accuracy``)."""

    entry = TASKS["words"]
    OPTIONS = ("data", "group", "lengths", "multiples", "count", "seed", "hard_prob", "prefixes", "batch_size")
    quality = "accuracy_last10"

    def __init__(
        self, checkpoint: str | Path, *, data: list | None = None,
        group: str | None = None, lengths: list[int] | None = None, multiples: list[int] | None = None,
        count: int | None = None, seed: int | None = None, hard_prob: float | None = None, prefixes: bool | None = None,
        batch_size: int | None = None,
    ):
        super().__init__(checkpoint, batch_size)
        self.data = [Path(path) for path in data or []]
        self.group, self.lengths, self.multiples, self.count = group, lengths, multiples, count
        self.seed = 0 if seed is None else seed
        self.hard_prob = hard_prob
        self.prefixes = bool(prefixes)
        self.train_length: int | None = None

    def require(self, evaluation: str) -> None:
        super().require(evaluation)
        if self.prefixes and evaluation != "length":
            raise OptionError(f"prefixes scores the lengths of a length evaluation; the {evaluation} evaluation reads "
                              "each length's own words", arguments=("prefixes",))
        if self.prefixes and self.data:
            raise OptionError("prefixes draws the words it scores; a word file's words are read whole",
                              arguments=("prefixes", "data"))

    def resolve(self) -> None:
        train = self.training()
        group = self.group or train.get("group")
        if not group:
            raise OptionError("group is needed: the checkpoint does not name its training group", arguments=("group",))
        _check_group_fits(group, train.get("group"), self.model.config.vocab_size)
        self.group, self.train_length = group, train.get("sequence_length")
        if self.hard_prob is None:
            self.hard_prob = train.get("hard_prob")

    def evaluation_sets(self, count: int = COUNT) -> list[WordWindows]:
        """The words of each ``data`` file, or fresh words at each requested length, read a
        window at a time as they are evaluated."""
        if self.data:
            return [StoredWords(words.inputs, words.targets) for words in (load_words(path, self.group) for path in self.data)]
        lengths = self.test_lengths()
        if self.prefixes:  # the longest words alone: evaluate_sets scores the others on their prefixes
            lengths = lengths[-1:]
        count = count if self.count is None else self.count
        return [held_out_word_windows(self.group, n, count, self.seed, self.hard_prob) for n in lengths]

    def test_lengths(self) -> list[int]:
        """The requested lengths of generated words (with ``prefixes``: sorted, each once)."""
        if self.multiples:
            if not self.train_length:
                raise OptionError(
                    "multiples needs the training length, which the checkpoint does not record; give lengths",
                    arguments=("multiples", "lengths"),
                )
            lengths = [self.train_length * m for m in self.multiples]
        elif self.lengths:
            lengths = self.lengths
        else:
            raise OptionError(
                "give lengths (e.g. [16, 32, 64]), multiples (e.g. [1, 2, 4, 8]) or data (a word file)",
                arguments=("lengths", "multiples", "data"),
            )
        return sorted(set(lengths)) if self.prefixes else lengths

    def evaluate(self, model, test_set, mode="simultaneous", fixed_point=None, warn=True, progress=False):
        return self._rows(model, test_set, mode, fixed_point, warn, progress)[-1]

    def evaluate_sets(self, model, test_sets, mode="simultaneous", progress=False):
        if not self.prefixes:
            return super().evaluate_sets(model, test_sets, mode, progress)
        return self._rows(model, test_sets[0], mode, progress=progress, prefixes=self.test_lengths()[:-1])

    def _rows(self, model, test_set, mode, fixed_point=None, warn=True, progress=False, prefixes=()):
        """``prefix_accuracy``'s rows on ``test_set`` after the checks of its memory and time."""
        fixed_point = self.settings(fixed_point)
        seconds = self.one_pass_seconds(model, test_set, mode)
        require(_described(test_set), evaluation_bytes(model, test_set, mode, self.batch_size, fixed_point))
        require_time(_described(test_set), seconds, **TOO_LONG)
        if "max_iter" not in fixed_point:
            # No budget given: a simultaneous solve gets what words of this length need
            # (the model's own may be a training length's).
            fixed_point = with_word_budget(model, test_set.length, fixed_point)
        return prefix_accuracy(model, test_set, None, prefixes, mode, batch_size=self.batch_size, warn=warn,
                               progress=progress, fixed_point=fixed_point)

    def one_pass_seconds(self, model, test_set: WordWindows, mode: str) -> float:
        """``evaluation_seconds``, once the checks that take no forward over a whole window
        pass (an absurd size is refused in about a second): the words' sizes against the
        memory, then a forward over one solve's positions against the time limit."""
        own = self.fixed_point
        require(_described(test_set), held_bytes(model, test_set, mode, self.batch_size, own))
        require_time(_described(test_set), evaluation_seconds(model, test_set, mode, self.batch_size, True, own),
                     **TOO_LONG)
        return evaluation_seconds(model, test_set, mode, self.batch_size, fixed_point=own)

    def format_rows(self, rows: list[dict[str, Any]]) -> str:
        # Token 1 is left out of "all": its label is its input. "retries": of the passes, those retries spent.
        lines = [f"{'length':>8}{'last10':>9}{'all':>9}{'passes':>10}{'retries':>9}{missed_header(rows)}"]
        for row in rows:
            passes = f"{row['fp_passes_mean']:>10.1f}" if "fp_passes_mean" in row else f"{'-':>10}"
            lines.append(f"{row['length']:>8}{row['accuracy_last10']:>9.1%}{row['accuracy']:>9.1%}{passes}"
                         f"{retries_cell(row)}{missed_cell(row)}")
        return "\n".join(lines)

    def budget(self, mode: str) -> dict[str, Any]:
        budget = super().budget(mode)
        if mode == "simultaneous" and "max_iter" in budget and "max_iter" not in self.fixed_point:
            # Raised for each length's words (with_word_budget): each row names its own.
            del budget["max_iter"]
        return budget

    def length_record(self, rows, mode) -> TaskRecord:
        record = word_length_record(rows, self.group, mode, self.train_length)
        # What the rows read: each length's own words, or the prefixes of the longest's.
        return dataclasses.replace(record, details={**record.details, "prefixes": self.prefixes})

    def convergence_inputs(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        # Hard vs easy only where the group is a product, whose first factor the mask reads.
        product = len(get_group(self.group).factor_orders) > 1
        words = self.evaluation_sets(CONVERGENCE_COUNT)
        for each in words:
            require(f"{each.count} test words of length {each.length:,}", 2 * each.count * each.length * each.token_bytes)
        return [(inputs, hard_token_mask(self.group, inputs) if product else None)
                for inputs, _ in (each.arrays() for each in words)]

    def details(self) -> dict[str, Any]:
        return {"group": self.group}

    @property
    def budget_title(self) -> str:
        return f"{self.group} word problem: test-time compute"

    @property
    def convergence_title(self) -> str:
        return f"{self.group}: passes per token (sequential mode)"


def _described(words: WordWindows) -> str:
    return f"{words.count} test words of length {words.length:,}"


def _check_group_fits(group: str, trained: str | None, vocab_size: int) -> None:
    """A model answers in the elements of the group it was trained on: another group's words
    would be read as those elements and scored against meaningless labels."""
    algebra = get_group(group)
    if trained and algebra.name != get_group(trained).name:
        raise OptionError(f"group={group}: the checkpoint was trained on {trained}; evaluate it on {trained}",
                          arguments=("group",))
    if algebra.order != vocab_size:
        raise OptionError(f"group={group}: {algebra.order} elements, but the model reads {vocab_size} tokens",
                          arguments=("group",))


class WordBatches:
    """Word problems: fresh words drawn from ``(seed, micro-batch)``, or, from a word file, a
    seeded shuffle per epoch (the rows of a batch read in sorted order, which a memory map
    serves faster); labels derived here when the file does not store them."""

    # Training sizes whose class defaults only suit a GPU: none, the task's own defaults replace them.
    PAPER_SCALE_DEFAULTS: tuple[str, ...] = ()
    # What the training data is, as a message asking for it names it.
    DATA_FORM = "FILE"

    def __init__(
        self, group: str, sequence_length: int, batch_size: int, seed: int = 0, data: WordData | None = None,
        hard_prob: float | None = None, rank: int = 0, world_size: int = 1,
    ):
        self.group, self.sequence_length, self.batch_size, self.seed = group, sequence_length, batch_size, seed
        self.data, self.hard_prob, self.rank, self.world_size = data, hard_prob, rank, world_size
        self.global_rows = batch_size * world_size
        if data is not None and data.inputs.shape[1] != sequence_length:
            # The run would record, and its evaluations read, a length it did not train at.
            raise OptionError(f"training words of length {data.inputs.shape[1]}, but sequence_length={sequence_length}; "
                              "train at the words' length")
        if data is not None and data.inputs.shape[0] < self.global_rows:
            raise DataError(
                f"training file has {data.inputs.shape[0]} sequences, fewer than the batch size {self.global_rows}"
            )
        self.position = 0  # micro-batches handed out so far
        self.tokenizer = None  # a word's tokens are the group's elements

    @classmethod
    def for_training(cls, config, data: WordData | None, rank: int = 0, world_size: int = 1) -> WordBatches:
        """The batches of a run with the training options ``config`` on ``data``: a word file's
        ``WordData``, or None for fresh words drawn from the seed."""
        if data is not None and not isinstance(data, WordData):
            raise OptionError(f"words train on a WordData (or fresh words: None), got {type(data).__name__}")
        return cls(
            config.group, config.sequence_length, config.batch_size, config.seed, data, config.hard_prob,
            rank=rank, world_size=world_size,
        )

    @classmethod
    def from_path(cls, config, data: str | Path | None) -> WordBatches:
        """``for_training`` on the word file at ``data`` (None: fresh words)."""
        return cls.for_training(config, None if data is None else load_words(data, config.group))

    def held_out(self) -> None:
        """No held-out split: fresh test words are the evaluation's (``WordsTask``)."""
        return None

    def longer_inputs(self, multiple: int, count: int) -> torch.Tensor:
        """``count`` fresh test words ``multiple`` times the training length: word problems are
        read at lengths beyond their training (length extrapolation)."""
        inputs, _ = held_out_words(self.group, multiple * self.sequence_length, count, seed=self.seed,
                                   hard_prob=self.hard_prob)
        return torch.as_tensor(inputs, dtype=torch.long)

    def step_metrics(self, loss: float, logits: torch.Tensor, labels: torch.Tensor, mean_over_processes) -> dict[str, float]:
        """The loss and the share of the last micro-batch's labels predicted, over all processes
        (``mean_over_processes``: each holds as many labels, so the mean of their shares is the
        share of the whole)."""
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == labels).float().mean()
        return {"loss": loss, "accuracy": mean_over_processes(accuracy)}

    def __iter__(self) -> WordBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self._rows(self.position)
        self.position += 1
        return _to_tensors(inputs, targets)

    def _rows(self, micro_batch: int) -> tuple[np.ndarray, np.ndarray]:
        own = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        if self.data is None:
            inputs, targets = generate_words(
                get_group(self.group), self.sequence_length, self.global_rows,
                seed=_micro_batch_seed(self.seed, micro_batch), hard_prob=self.hard_prob,
            )
            return inputs[own], targets[own]
        count = self.data.inputs.shape[0]
        epoch, index = divmod(micro_batch, count // self.global_rows)
        order = np.random.default_rng([self.seed, epoch]).permutation(count)
        rows = np.sort(order[index * self.global_rows:(index + 1) * self.global_rows][own])
        return self.data.inputs[rows], self.data.targets[rows]

    def state_dict(self) -> dict[str, int]:
        return {"micro_batches": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["micro_batches"])

    def description(self) -> dict[str, Any] | None:
        """What identifies the training words: None for fresh words drawn from the seed."""
        if self.data is None:
            return None
        inputs = self.data.inputs
        shape = {"group": self.data.group, "count": int(inputs.shape[0]), "length": int(inputs.shape[1])}
        return {**shape, "inputs_sha256": self._inputs_sha256}

    @staticmethod
    def data_named(description: dict[str, Any] | None) -> str:
        """The training words a ``description`` identifies, in words."""
        if description is None:
            return "fresh words"
        if not isinstance(description, dict):  # an edited trainer.json
            return f"words its record describes as {description!r}"
        digest = description.get("inputs_sha256")
        return (f"a word file of {description.get('count')} words of length {description.get('length')} over "
                f"{description.get('group')}" + (f" (sha256 {digest[:12]})" if isinstance(digest, str) else ""))

    @functools.cached_property
    def _inputs_sha256(self) -> str:
        # Once per run: every checkpoint records it, and hashing reads the whole word file.
        return _inputs_digest(self.data.inputs)

    def prepare(self, model) -> None:
        order = get_group(self.group).order
        if model.config.vocab_size < order:
            raise OptionError(f"the model's vocab_size {model.config.vocab_size} is smaller than {self.group}'s {order} elements")


def _micro_batch_seed(seed: int, micro_batch: int) -> int:
    return int(np.random.SeedSequence([seed, micro_batch]).generate_state(1)[0])


def _inputs_digest(inputs: np.ndarray, rows_per_chunk: int = 65536) -> str:
    """SHA-256 of the words' element indices (as little-endian int64, whatever the file's
    dtype), read in chunks so that a memory-mapped file is not loaded whole. The targets
    follow from the inputs and the group."""
    digest = hashlib.sha256()
    for start in range(0, inputs.shape[0], rows_per_chunk):
        digest.update(np.ascontiguousarray(inputs[start:start + rows_per_chunk], dtype="<i8").tobytes())
    return digest.hexdigest()


def _to_tensors(inputs: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))
