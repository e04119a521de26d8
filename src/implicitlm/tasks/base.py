"""What an evaluation needs of a task: a ``Task`` names its checkpoint and its own options and
gives the evaluations in ``eval/`` (by length, by budget of passes, per-token convergence)
its evaluation sets, its metrics, its tables, the names of its records and what its length
record holds (``TaskRecord``), with its figure described (``Figure``) for ``eval/`` to draw.

A task is described before anything is read: ``load`` reads the checkpoint's model and
settles the task's options against what its training recorded (a group, a training length),
``evaluation_sets`` then reads or generates the data of each test length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.duration import require_time, seconds_of
from ..core.errors import OptionError
from ..core.run_folder import training_settings
from ..deq.options import FixedPointOptions
from ..models import load_model
from . import EVALUATIONS, TaskEntry

# What needs an implicit model, in an error's words: a sweep of its budget, its passes per token.
NEEDS_IMPLICIT = {"budget": "a budget sweep", "convergence": "convergence statistics"}
# The fixed-point settings that set a budget: any of them given, the checkpoint's is not the one used.
BUDGET_FIELDS = {"passes", "max_iter", "tol"}
# The kinds of figure ``eval/`` draws: lines over a shared x axis; a bar per x value (a category).
FIGURE_KINDS = ("curves", "bars")


@dataclass(frozen=True)
class Figure:
    """A record's figure as a task describes it; ``eval/`` draws it by its ``kind`` alone.
    ``series``: ``{"label", "x", "y"}`` each (a line, or a set of bars); ``axes``: the "x" and
    "y" labels and the "xscale" / "yscale" ("linear", "log", "log2"); ``vertical`` /
    ``horizontal``: labelled reference lines at an x or a y value (the training length, chance);
    ``ylim``: the y range shown."""

    kind: str
    title: str
    series: list[dict[str, Any]]
    axes: dict[str, str]
    vertical: dict[str, float] = field(default_factory=dict)
    horizontal: dict[str, float] = field(default_factory=dict)
    ylim: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        # Refused when the task builds it, not after an evaluation, with its record half written.
        if self.kind not in FIGURE_KINDS:
            raise OptionError(f"figure kind {self.kind!r}: one of {', '.join(FIGURE_KINDS)}")


@dataclass(frozen=True)
class TaskRecord:
    """What a task's record of an evaluation holds besides the checkpoint and the model, which
    ``eval/`` adds as it writes it: ``<experiment>.json`` with the ``metrics``, the ``curves``
    on their ``axes`` (if any) and the ``details``, and ``<experiment>.png``, the ``figure``."""

    experiment: str
    metrics: dict[str, float]
    figure: Figure
    curves: list[dict[str, Any]] | None = None
    axes: dict[str, str] | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A task an evaluation runs on. Subclasses set the class attributes below and take their
    options (``OPTIONS``) as keywords; an option left out (None) takes the task's default. A task
    of the table (``tasks.TASKS``) names its ``entry``, which sets its name, its evaluations, the
    names of their records and its batch size."""

    entry: ClassVar[TaskEntry]
    name: ClassVar[str]  # "words", "lm", "catbabi": the value of --task
    OPTIONS: ClassVar[tuple[str, ...]]  # the options it takes besides the checkpoint
    EVALUATIONS: ClassVar[tuple[str, ...]] = EVALUATIONS  # the evaluations that make sense for it
    BATCH_SIZE: ClassVar[int]
    experiment: ClassVar[str]  # the record of a length evaluation: <experiment>.json and .png
    budget_experiment: ClassVar[str]  # the record of a budget sweep
    quality: ClassVar[str]  # the metric of a row that a budget sweep plots against the budget
    quality_scale: ClassVar[str] = "linear"  # the scale of its axis ("log" for a perplexity)
    # The dtype the model is evaluated in (None: as saved). Every task takes it
    # (``make_task``), so it is no task's own option.
    dtype: torch.dtype | None = None
    # The device it is evaluated on (None: where it loads, the CPU), taken as the dtype is.
    device: torch.device | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The table is read before the classes are (the command line's choices and helps): what
        # it names is taken from it, not written again beside it.
        if "entry" in vars(cls):
            cls.name, cls.EVALUATIONS = cls.entry.name, tuple(cls.entry.records)
            cls.experiment, cls.budget_experiment = cls.entry.records["length"], cls.entry.records["budget"]
            cls.BATCH_SIZE = cls.entry.batch_size

    def __init__(self, checkpoint: str | Path, batch_size: int | None = None):
        self.checkpoint = Path(checkpoint)
        self.batch_size = self.BATCH_SIZE if batch_size is None else batch_size
        self.model = None
        # ``FixedPointOptions`` fields, the budget among them, that every forward of an evaluation
        # changes the model's own by; the model's own are left as they are.
        self.fixed_point: dict[str, Any] = {}

    def solve_with(self, **fixed_point: Any) -> "Task":
        """Evaluate with these ``FixedPointOptions`` fields in place of the model's own
        (``max_iter=64``, ``tol``, ``solver``, ``chunk_length`` ...): checked now, before
        anything is read."""
        FixedPointOptions().replace(**{**self.fixed_point, **fixed_point})
        self.fixed_point.update(fixed_point)
        return self

    def settings(self, fixed_point: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``FixedPointOptions`` fields one evaluation's forwards are given: the task's own
        (``solve_with``) changed by ``fixed_point`` (a point of a budget sweep)."""
        return {**self.fixed_point, **(fixed_point or {})}

    def require(self, evaluation: str) -> None:
        """Refuse, in one line, an evaluation that makes no sense for this task."""
        if evaluation not in self.EVALUATIONS:
            raise OptionError(f"{evaluation} is not evaluated for the {self.name} task{self.refusal_hint(evaluation)}",
                              arguments=("split",))

    def refusal_hint(self, evaluation: str) -> str:
        return ""

    def budget(self, mode: str) -> dict[str, Any]:
        """The budget the loaded model's solves in ``mode`` were given, as records keep it:
        ``passes`` K, or ``max_iter`` and ``tol`` (a solve to the tolerance); ``given``: set by
        the task's ``fixed_point`` settings, else the checkpoint's default; ``implicit`` False
        for an explicit model, which has none."""
        given = bool(BUDGET_FIELDS & self.fixed_point.keys())
        if not self.model.config.implicit:
            return {"implicit": False, "given": given}
        options = self.model.fixed_point_options(self.fixed_point)
        if options.passes:
            return {"passes": options.passes, "given": given}
        return {**dict(zip(("max_iter", "tol"), options.budget(None, None, mode))), "passes": 0, "given": given}

    def load(self):
        """The checkpoint's model, the task's fixed-point settings (``solve_with``) checked
        against it, the task's options settled against its training settings."""
        self.model = load_model(self.checkpoint, dtype=self.dtype)
        if self.device is not None:
            self.model.to(self.device)
        self.model.fixed_point_options(self.fixed_point)
        self.resolve()
        return self.model

    def prepare(self, evaluation: str) -> tuple[Any, list[Any]]:
        """(model, data) for ``evaluation``: the model loaded, the task's data (its test sets, or
        for convergence its token arrays and masks), an implicit model where the evaluation needs
        one."""
        self.require(evaluation)
        model = self.load()
        if evaluation in NEEDS_IMPLICIT:
            require_implicit(model, NEEDS_IMPLICIT[evaluation])
        data = self.convergence_inputs() if evaluation == "convergence" else self.evaluation_sets()
        return model, data

    def training(self) -> dict[str, Any]:
        """The training settings the checkpoint records, none for an imported or hand-made
        model (read after ``load_model``, which finishes a checkpoint swap that a killed run
        left half done)."""
        return training_settings(self.checkpoint)

    def resolve(self) -> None:
        """Check the options against the loaded model and its training settings."""

    @abstractmethod
    def evaluation_sets(self) -> list[Any]:
        """The test data, one set per test length, in the order of the rows."""

    @abstractmethod
    def evaluate(self, model, test_set: Any, mode: str = "simultaneous", fixed_point: dict[str, Any] | None = None,
                 warn: bool = True, progress: bool = False) -> dict[str, Any]:
        """One row of metrics on ``test_set``, with its ``length`` and, for implicit models,
        the mean passes of its solves (``fp_passes_mean``, with the budget) and the misses of
        the tolerance; every forward given ``settings(fixed_point)``. ``warn``: log a line when
        fixed points missed it (a budget sweep, whose table shows them, turns it off);
        ``progress``: a bar inside the set's evaluation, where the task has one."""

    def evaluate_sets(self, model, test_sets: list[Any], mode: str = "simultaneous",
                      progress: bool = False) -> list[dict[str, Any]]:
        """The rows of a length evaluation: ``evaluate`` on each test set (a task that can score
        several lengths in one read gives them all here)."""
        return [self.evaluate(model, test_set, mode=mode, progress=progress)
                for test_set in tqdm(test_sets, desc="eval", disable=not progress)]

    @abstractmethod
    def format_rows(self, rows: list[dict[str, Any]]) -> str:
        """The rows of a length evaluation as the aligned table the command prints."""

    @abstractmethod
    def length_record(self, rows: list[dict[str, Any]], mode: str) -> TaskRecord:
        """The record of a length evaluation (``experiment``) whose rows are ``rows``, evaluated
        in ``mode``, and its figure."""

    def one_pass_seconds(self, model, test_set: Any, mode: str) -> float:
        """A lower bound on the seconds ``evaluate`` takes on ``test_set`` in ``mode``, every
        solve at one pass (where a solve to the tolerance may stop), timed on one forward:
        what ``require_sweep_time`` multiplies. A task that times nothing (a test's): 0. Probed
        with the task's own settings: a sweep changes only the budget, which a probe does not spend."""
        return 0.0

    def require_sweep_time(self, model, test_sets: list[Any], mode: str, what: str, passes: Sequence[int] = (1,),
                           arguments: Sequence[str] = (), hint: str = "") -> None:
        """Refuse, before it starts, ``what``: an evaluation of ``test_sets`` at each of
        ``passes`` passes per solve (1: a solve to the tolerance, which may stop there), past
        the time limit (``core.duration.require_time``), naming ``arguments``."""
        seconds = sum(passes) * sum(self.one_pass_seconds(model, test_set, mode) for test_set in test_sets)
        require_time(what, seconds, arguments=arguments, hint=hint)

    def convergence_inputs(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Token arrays (N, L) whose passes per token a convergence report counts, each with
        a mask of its hard tokens (None where the task has no such split)."""
        raise OptionError(f"convergence is not evaluated for --task {self.name}")

    def details(self) -> dict[str, Any]:
        """What a budget or convergence record names besides the model (e.g. the group)."""
        return {}

    @property
    def budget_title(self) -> str:
        return "test-time compute"

    @property
    def convergence_title(self) -> str:
        return "passes per token (sequential mode)"


class FolderTask(Task):
    """A task that reads the ``split`` (default: test) of one ``data`` folder, given once or as
    a list of one."""

    FOLDER: ClassVar[str]  # what the folder holds, for the error that asks for it

    def __init__(self, checkpoint: str | Path, data: Any = None, split: str | None = None, batch_size: int | None = None):
        super().__init__(checkpoint, batch_size)
        folders = [data] if isinstance(data, (str, Path)) else list(data or [])
        if len(folders) != 1:
            raise OptionError(f"the {self.name} task reads one data folder ({self.FOLDER}), got {len(folders) or 'none'}",
                              arguments=("data",))
        self.data, self.split = Path(folders[0]), "test" if split is None else split


def one_forward(model, mode: str, rows: int, positions: int, use_cache: bool = False,
                fixed_point: FixedPointOptions | dict[str, Any] | None = None) -> Callable[[], None]:
    """A forward over ``rows`` sequences' ``positions`` tokens given ``fixed_point``, as a probe:
    each solve stops at its first evaluation."""
    tokens = torch.zeros((rows, positions), dtype=torch.long, device=next(model.parameters()).device)

    def one_batch() -> None:
        with torch.no_grad():
            output = model(tokens, mode=mode, use_cache=use_cache, fixed_point=fixed_point, probe=True)
            output.logits.argmax(-1)

    return one_batch


# The tokens a sequential forward is timed on: each token is a step of the same work, and
# the rest is scaled from them (a probe over all of them would be the work itself).
SEQUENTIAL_PROBE_TOKENS = 8


def forward_seconds(model, mode: str, rows: int, positions: int, count: int,
                    fixed_point: FixedPointOptions | dict[str, Any] | None = None) -> float:
    """A lower bound on the seconds ``count`` forwards over ``rows`` sequences of ``positions``
    tokens take in ``mode`` given ``fixed_point``: one of them, timed at one pass per solve (in
    sequential mode, its first tokens, scaled), ``count`` times."""
    if not count:
        return 0.0
    probed = min(positions, SEQUENTIAL_PROBE_TOKENS) if mode == "sequential" else positions
    probe = one_forward(model, mode, rows, probed, fixed_point=fixed_point)
    if probed < positions:
        probe()  # the first forward pays for setting up the kernels, which the scaling would multiply
    return seconds_of(probe) * (positions // probed) * count


def require_implicit(model, what: str) -> None:
    if not model.config.implicit:
        raise OptionError(f"{what} needs an implicit model; this checkpoint is explicit")


def missed_header(rows: list[dict[str, Any]]) -> str:
    """``missed_cell``'s column: "last residual" where the rows' solves were of exactly K passes,
    which hold no tolerance to miss; "not converged" where they were to the tolerance; both
    where some were of each (a sweep of passes beside the fixed point)."""
    in_passes = any("fp_in_passes" in row for row in rows)
    to_tolerance = any("fp_not_converged_share" in row and "fp_in_passes" not in row for row in rows)
    title = "resid.|missed" if in_passes and to_tolerance else "last residual" if in_passes else "not converged"
    return f"{title:>15}"


def missed_cell(row: dict[str, Any]) -> str:
    """A solve's outcome: of exactly K passes, the mean residual of their last pass; to the
    tolerance, the share of fixed points above it ("-": explicit)."""
    if "fp_in_passes" in row:
        return f"{row['fp_last_residual_mean']:>15.2e}"
    return f"{row['fp_not_converged_share']:>15.2%}" if "fp_not_converged_share" in row else f"{'-':>15}"


def retries_cell(row: dict[str, Any]) -> str:
    """The "retries" column: of the passes per fixed point, those spent solving again the
    chunks that missed the tolerance ("-": none could be, explicit or K passes)."""
    return f"{row['fp_retry_passes_mean']:>9.1f}" if "fp_retry_passes_mean" in row else f"{'-':>9}"


def convergence_line(figures: dict[str, Any]) -> str | None:
    """What the fixed points of an evaluation came to (``ConvergenceTally.as_dict``), in a line;
    None for an explicit model's, which has none."""
    if not figures.get("fp_fixed_points"):
        return None
    parts = []
    if "fp_in_passes" in figures:
        parts.append(f"{figures['fp_in_passes']:,} of exactly {figures['fp_passes_per_solve']} passes, last residual mean "
                     f"{figures['fp_last_residual_mean']:.2e}, max {figures['fp_last_residual_max']:.2e}")
    if "fp_not_converged_share" in figures:
        parts.append(f"not converged {figures['fp_not_converged_share']:.2%} ({figures['fp_stopped_at_budget']:,} at the "
                     f"budget, {figures['fp_diverged']:,} diverged), {figures['fp_retried']:,} retried "
                     f"({figures['fp_retry_passes_mean']:.1f} retry passes per fixed point)")
    return f"fixed points: {figures['fp_fixed_points']:,}; " + "; ".join(parts) + f"; {figures['fp_non_finite']:,} non-finite"


def budget_line(budget: dict[str, Any]) -> str:
    """``Task.budget``'s budget as a table's first line."""
    if "implicit" in budget:
        return "budget: one pass of the stack (an explicit model)"
    whence = "as given" if budget["given"] else "the checkpoint's default"
    if budget.get("passes"):
        return f"budget: {budget['passes']} passes per solve, no tolerance ({whence})"
    within = budget.get("max_iter", "each row's max_iter")
    return f"budget: to tolerance {budget['tol']:g} within {within} passes per solve ({whence})"
