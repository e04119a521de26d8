"""Every form this package once saved, and what it reads as today: one function per old form.

The readers call these and hold no history themselves. It sits in ``core`` because the old
forms are read at every layer: a shard index in ``data``, a checkpoint's training settings
in ``presets`` and ``tasks``, a model preset's size file in ``presets``, a checkpoint's
folder, training state and data in ``train``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .atomic_io import recover_replaced
from .errors import DataError, OptionError, check_header_keys
from .option_names import TRAINING_SETTINGS
from .schema import at_least, check_field

# The one checkpoint folder of a run of the former word trainer: ``RUN/checkpoint``.
FORMER_WORD_CHECKPOINT = "checkpoint"

# The fixed-point options as torchdeq spelt them (``f_`` the forward solve, ``eval_`` its
# inference budget), and the curriculum's phase budgets as counts of "iters"; saved since
# under the one vocabulary of deq.options (``max_iter`` / ``tol`` for inference).
RENAMED_FIXED_POINT_OPTIONS = {
    "f_solver": "solver", "f_max_iter": "train_max_iter", "f_tol": "train_tol", "f_stop_mode": "stop_mode",
    "eval_f_max_iter": "max_iter", "eval_f_tol": "tol", "eval_f_solver": "simultaneous_solver",
    "sequential_f_solver": "sequential_solver", "eval_chunk_length": "chunk_length",
    "eval_nonconvergence": "nonconvergence",
}
RENAMED_PHASE_BUDGETS = {"bounded_iters": "bounded_max_iter", "free_iters": "free_max_iter"}

# A model preset's size file (``presets/models/*.json``) named its free variant's training
# budget in iterations before a solve's cost had the one name, passes.
RENAMED_SIZE_FILE_KEYS = {"free_iterations": "free_passes"}

# Training options the former trainers spelt otherwise; a preset or command that still
# spells them so is refused with today's name.
RENAMED_TRAINING_OPTIONS = {
    "train_length": "sequence_length",
    "micro_batch_size": "batch_size",
    "bounded_steps": "total_steps with bounded_fraction (the bounded share of the steps after unroll_steps)",
    "free_steps": "total_steps with bounded_fraction (the bounded share of the steps after unroll_steps)",
    **RENAMED_PHASE_BUDGETS,
}

# The few-pass stage's settings, at their defaults when it came (train/config.py): settings
# recorded before then lack them, and their runs had no such stage.
BEFORE_FEW_PASS_STAGE = {
    "few_pass_steps": 0, "few_pass_passes": 2, "few_pass_distance": 0.0, "few_pass_fixed_point": 1.0,
    "few_pass_jacobian": 0.0,
}
# The few-pass stage's distillation of logits, at its default when it came: off.
BEFORE_FEW_PASS_DISTILLATION = {"few_pass_logits": 0.0}
# The contraction stage's, as the few-pass stage's.
BEFORE_CONTRACTION_STAGE = {"contraction_steps": 0, "contraction_jacobian": 0.1}


def refuse_renamed_training_options(values: Mapping[str, Any]) -> None:
    """An option given under a former trainer's name is an OptionError naming today's."""
    for old, new in RENAMED_TRAINING_OPTIONS.items():
        if old in values:
            raise OptionError(f"training option '{old}' is now {new}")


def former_word_checkpoint(run_dir: Path) -> Path | None:
    """The former word trainer kept one checkpoint, ``RUN/checkpoint``, replaced at every save;
    today's runs keep ``RUN/checkpoints/step_NNNNNNN``. Returns that folder (a swap cut
    between its two renames finished first), or None where the run has none."""
    former = run_dir / FORMER_WORD_CHECKPOINT
    recover_replaced(former)
    return former if former.is_dir() else None


def fixed_point_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """A config's ``fixed_point`` with today's names: a config saved before the one
    vocabulary spelt them as torchdeq does. A key given under both names is refused."""
    return _renamed(values, RENAMED_FIXED_POINT_OPTIONS, "fixed-point option")


def model_size_file(values: Mapping[str, Any]) -> dict[str, Any]:
    """A model preset's size file with today's keys: one written before the one vocabulary
    spelt ``free_passes`` ``free_iterations``. A key given under both names is refused."""
    return _renamed(values, RENAMED_SIZE_FILE_KEYS, "model size file key")


def _renamed(values: Mapping[str, Any], renamed: Mapping[str, str], what: str) -> dict[str, Any]:
    current = dict(values)
    for old, new in renamed.items():
        if old in current:
            if new in current:
                raise OptionError(f"{what} given twice: '{old}' is the former name of '{new}'")
            current[new] = current.pop(old)
    return current


def training_settings(settings: Mapping[str, Any], source: object) -> dict[str, Any]:
    """A checkpoint's training settings (its ``trainer.json`` "train", read from ``source``) as
    ``TrainConfig`` spells them today, with the ``task``: today's carry it; the former LM
    trainer's spell ``micro_batch_size``; the rest are the former word trainer's. The phase
    budgets of either are renamed (``free_iters`` is ``free_max_iter``). Any key not among
    today's names is refused, not dropped: a misspelt ``lrr`` would run at the default rate.
    Settings recorded before the few-pass stage, its distillation or the contraction stage came
    get their settings, off. A setting given under both its names, or a former one of the wrong type, is a one-line
    DataError naming ``source``."""
    try:
        settings = _renamed(settings, RENAMED_PHASE_BUDGETS, "training option")
        if "task" not in settings:
            settings = former_lm_settings(settings) if "micro_batch_size" in settings else former_word_settings(settings)
    except OptionError as error:
        raise DataError(f"{source}: {error}") from None
    check_header_keys(settings, TRAINING_SETTINGS, source, "the training settings")
    for stage in (BEFORE_FEW_PASS_STAGE, BEFORE_FEW_PASS_DISTILLATION, BEFORE_CONTRACTION_STAGE):
        if not any(name in settings for name in stage):
            settings = {**settings, **stage}
    return settings


def former_word_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The former word trainer recorded ``train_length`` and the step counts of its two phases
    (``bounded_steps``, ``free_steps``, after ``unroll_steps``), and lacked the options it
    had no use for. Becomes ``sequence_length``, ``total_steps`` with ``bounded_fraction``,
    and those options at the values it trained with."""
    settings = _renamed(settings, {"train_length": "sequence_length"}, "training option")
    phases = {name: settings.pop(name) for name in ("bounded_steps", "free_steps") if name in settings}
    for name, steps in phases.items():
        check_field("training option", name, steps, int, at_least(0))
    if len(phases) == 2:
        bounded, free = phases["bounded_steps"], phases["free_steps"]
        settings["total_steps"] = settings.get("unroll_steps", 0) + bounded + free
        settings["bounded_fraction"] = bounded / (bounded + free) if bounded + free else 1.0
    unrecorded = {
        "betas": [0.9, 0.999], "batch_tokens": 0, "distributed": "ddp", "activation_checkpointing": False,
        "eval_every": 0, "eval_batches": 8, "keep_checkpoints": 1,
    }
    return {**unrecorded, **settings, "task": "words"}


def former_lm_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The former LM trainer spelt ``batch_size`` ``micro_batch_size`` and had no unroll
    warm-up nor the word-problem options. Becomes ``batch_size``, ``unroll_steps`` 0 and the
    word options at the values an LM run records."""
    settings = dict(settings)
    settings["batch_size"] = settings.pop("micro_batch_size")
    unrecorded = {"unroll_steps": 0, "unroll_depth": 16, "group": "S3", "hard_prob": None}
    return {**unrecorded, **settings, "task": "lm"}


def former_word_training_state(checkpoint: Path, state: dict[str, Any], step: int) -> dict[str, Any]:
    """The former word trainer's training state (in its ``RUN/checkpoint``) held no batch
    position: its batches followed from the step, one micro-batch per step. Becomes the
    state with today's position, ``sampler: {"micro_batches": step}``; any other state is
    returned as it is."""
    if checkpoint.name != FORMER_WORD_CHECKPOINT or not isinstance(state, dict) or "sampler" in state:
        return state
    return {**state, "sampler": {"micro_batches": step}}


def data_description_before_digest(saved: Any, given: Any) -> Any:
    """A checkpoint written before the training words' digest was recorded describes its words
    without ``inputs_sha256``; a language model's, before its shards' digest was, records no
    data (null). Returns ``given`` (today's description of the data a resume trains on) in
    that form, so the two compare; else ``given`` as it is."""
    if isinstance(saved, dict) and isinstance(given, dict) and "inputs_sha256" not in saved:
        return {k: v for k, v in given.items() if k != "inputs_sha256"}
    if saved is None and isinstance(given, dict) and "shards_sha256" in given:
        return None
    return given


def shard_index_format_1(index: dict[str, Any]) -> dict[str, Any]:
    """A shard index in today's format (2). Format 1 was written before the tokenizer's digest
    was recorded: it lacks ``tokenizer_sha256`` and becomes format 2 with none (null). Any
    other index is returned as it is, for the reader to check."""
    if type(index.get("format_version")) is int and index["format_version"] == 1 and "tokenizer_sha256" not in index:
        return {**index, "format_version": 2, "tokenizer_sha256": None}
    return index
