"""Training on word problems (state tracking), on accelerate.

Batches are either drawn from a word-problem file or generated on the fly from a seed
and the step number, so a run is reproducible and a resumed run sees the same batches.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..core.atomic_io import recover_replaced
from ..data.groups import get_group
from ..data.words import WordData, generate_words
from ..deq import penalised
from ..core.schema import (
    NON_NEGATIVE, POSITIVE, SEED, UNIT_INTERVAL, at_least, check_dataclass, check_known_keys, field_names,
)
from .checkpoint import (
    CheckpointError,
    applying_training_state,
    read_meta,
    restore_weights,
    save_checkpoint,
    saved_settings,
)
from .curriculum import Curriculum, Phase
from .guard import non_finite_images
from .loop import StepOutcome, TrainingTask, chunk_evaluations_at, require_training, run_training
from .run_log import clear_earlier_run, refuse_earlier_run, run_folder_lock, tracking_options
from .schedule import apply_current_rate, warmup_stable_sqrt_decay
from .speed import accelerator_for, check_precision, compile_stack

CHECKPOINT = "checkpoint"
TRAINING_STATE_KEYS = ("optimizer", "scheduler", "torch_rng")


@dataclass(frozen=True)
class WordTrainConfig:
    group: str = "S3"
    train_length: int = 16
    batch_size: int = 128
    hard_prob: float | None = None
    lr: float = 3e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 50
    # Share of all steps, at the end, over which the rate falls to min_lr (0: constant to the end).
    decay_fraction: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    # Curriculum (implicit models); an explicit model trains for their sum.
    unroll_steps: int = 0
    unroll_depth: int = 16
    bounded_steps: int = 500
    bounded_iters: int = 4
    bounded_phantom_steps: int = 1
    free_steps: int = 0
    free_iters: int = 24
    free_phantom_steps: int = 4
    free_tol: float = 0.05
    log_every: int = 25
    checkpoint_every: int = 0
    # "auto": bf16 autocast on CUDA, full precision elsewhere.
    precision: str = "auto"
    compile: bool = False

    # The ranges of the fields above; their types are the annotations.
    FIELD_RULES = {
        "train_length": at_least(1), "batch_size": at_least(1), "hard_prob": UNIT_INTERVAL, "lr": POSITIVE,
        "min_lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "warmup_steps": NON_NEGATIVE,
        "decay_fraction": UNIT_INTERVAL, "grad_clip": POSITIVE, "seed": SEED,
        "unroll_steps": NON_NEGATIVE, "unroll_depth": at_least(1), "bounded_steps": NON_NEGATIVE,
        "bounded_iters": NON_NEGATIVE, "bounded_phantom_steps": at_least(1), "free_steps": NON_NEGATIVE,
        "free_iters": NON_NEGATIVE, "free_phantom_steps": at_least(1), "free_tol": POSITIVE,
        "log_every": at_least(1), "checkpoint_every": NON_NEGATIVE,  # 0: only at the end
    }
    # What each field means, for --help.
    FIELD_HELP = {
        "group": "the group whose running products are the labels (S3, A5, S5, A5xM, Z60, ...)",
        "train_length": "tokens per training word",
        "batch_size": "words per step",
        "hard_prob": "A5xM only: probability that a token is drawn from A5 (hard) rather than Z2 (easy)",
        "lr": "peak learning rate (AdamW)",
        "min_lr": "learning rate at the end of the decay",
        "weight_decay": "AdamW weight decay",
        "warmup_steps": "steps of linear warm-up from 0 to lr",
        "decay_fraction": "share of all steps, at the end, over which the rate falls to min_lr (1 - sqrt); 0: none",
        "grad_clip": "gradient norm clipped to this",
        "seed": "seed of initialisation and of the training words",
        "unroll_steps": "implicit: steps of the differentiable unroll warm-up (0: none, as the paper)",
        "unroll_depth": "implicit: stack applications in each warm-up step",
        "bounded_steps": "implicit: steps of the bounded phase (explicit: counted into its steps)",
        "bounded_iters": "implicit: solver iterations per bounded step (the paper's 4)",
        "bounded_phantom_steps": "implicit: phantom-gradient steps per bounded step (the paper's 1)",
        "free_steps": "implicit: steps of the free phase, solved to free_tol",
        "free_iters": "implicit: most solver iterations per free step",
        "free_phantom_steps": "implicit: phantom-gradient steps per free step",
        "free_tol": "implicit: relative residual at which a free-phase solve stops",
        "log_every": "steps between metrics lines",
        "checkpoint_every": "steps between checkpoints (0: only at the end)",
        "precision": "auto (bf16 autocast on CUDA, full precision elsewhere), float32, bfloat16, float16",
        "compile": "torch.compile the stack",
    }

    def __post_init__(self) -> None:
        check_dataclass(self, "training option")
        check_precision(self.precision)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "WordTrainConfig":
        check_known_keys(values, field_names(cls), "training option")
        return cls(**values)

    def gradient_passes(self, implicit: bool) -> int:
        """Passes of the stack whose graph a step keeps: the unroll's depth, or the phantom steps."""
        if not implicit:
            return 1
        unroll = self.unroll_depth if self.unroll_steps else 0
        return max(unroll, self.bounded_phantom_steps, self.free_phantom_steps)

    def curriculum(self, implicit: bool) -> Curriculum:
        if not implicit:
            return Curriculum((Phase("explicit", self.unroll_steps + self.bounded_steps + self.free_steps),))
        return Curriculum.unroll_bounded_free(
            self.unroll_steps,
            self.bounded_steps,
            self.free_steps,
            unroll_depth=self.unroll_depth,
            bounded=(self.bounded_iters, self.bounded_phantom_steps),
            free=(self.free_iters, self.free_phantom_steps),
            free_tol=self.free_tol,
        )


def train_words(
    model,
    config: WordTrainConfig,
    out_dir: str | Path,
    data: WordData | None = None,
    progress: bool = True,
    description: str = "train",
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, float]:
    """Train ``model`` in place; returns the last logged metrics. Checkpoints go to
    ``out_dir/checkpoint``, logs to ``out_dir/metrics.jsonl`` and ``out_dir/tensorboard``.

    A fresh run refuses an ``out_dir`` that holds an earlier run, or, with ``overwrite``,
    removes that run first. ``resume`` continues from ``out_dir/checkpoint`` (its weights replace the model's):
    optimiser, scheduler, RNG and the batch position are restored, so the run goes on as
    the uninterrupted one would have. A SIGTERM or SIGINT ends the run after the current
    step with a checkpoint (``TrainingInterrupted``); a non-finite loss or gradient ends
    it before the update (``NumericalFault``), leaving the last checkpoint as it was.
    """
    out_dir = Path(out_dir)
    with run_folder_lock(out_dir):
        return _train_words(model, config, out_dir, data, progress, description, resume, overwrite)


def _train_words(
    model, config: WordTrainConfig, out_dir: Path, data: WordData | None, progress: bool, description: str,
    resume: bool, overwrite: bool,
) -> dict[str, float]:
    checkpoint = out_dir / CHECKPOINT
    if not resume:
        refuse_earlier_run(out_dir, overwrite)
        clear_earlier_run(out_dir)
    require_training(model, config.batch_size, config.train_length, config.gradient_passes(model.config.implicit))
    chunk_evaluations_at(model, config.train_length)
    torch.manual_seed(config.seed)
    start_step, state = restore_weights(model, checkpoint, TRAINING_STATE_KEYS) if resume else (0, None)
    if resume:
        _check_same_data(checkpoint, data)
    accelerator = accelerator_for(config.precision, **tracking_options(out_dir))
    if config.compile:
        compile_stack(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    curriculum = config.curriculum(model.config.implicit)
    decay_steps = round(config.decay_fraction * curriculum.total_steps)
    scheduler = warmup_stable_sqrt_decay(
        optimizer, config.warmup_steps, curriculum.total_steps, decay_steps, config.min_lr / config.lr
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if state is not None:
        with applying_training_state(checkpoint, optimizer):
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            apply_current_rate(getattr(scheduler, "scheduler", scheduler), config.lr)  # accelerate wraps it
            torch.set_rng_state(state["torch_rng"])
    core = accelerator.unwrap_model(model)
    batches = _batches(config, data, accelerator.device, start_step)

    def forward_backward(model) -> StepOutcome:
        input_ids, labels = next(batches)
        output = model(input_ids, labels=labels)
        accelerator.backward(penalised(output.loss, output.fixed_point))

        def recheck():
            again = model(input_ids, labels=labels)
            return again.loss, non_finite_images(again)

        return StepOutcome(output.loss.item(), output, non_finite_images(output), input_ids.numel(), recheck, labels)

    task = TrainingTask(
        curriculum=curriculum, forward_backward=forward_backward, task_metrics=_word_metrics,
        save=lambda step: _checkpoint(accelerator, core, optimizer, scheduler, out_dir, step, config, data),
        grad_clip=config.grad_clip, log_every=config.log_every, checkpoint_every=config.checkpoint_every,
        description=description,
    )
    last_checkpoint = checkpoint if resume else None
    return run_training(task, accelerator, model, optimizer, scheduler, out_dir, start_step, last_checkpoint, progress)


def _word_metrics(outcome: StepOutcome) -> dict[str, float]:
    with torch.no_grad():
        accuracy = (outcome.output.logits.argmax(-1) == outcome.labels).float().mean().item()
    return {"loss": outcome.loss, "accuracy": accuracy}


def _checkpoint(
    accelerator, core, optimizer, scheduler, out_dir: Path, step: int, config: WordTrainConfig, data: WordData | None
) -> Path:
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        training_state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        meta = {"step": step, "train": asdict(config), "data": _data_description(data)}
        save_checkpoint(out_dir / CHECKPOINT, core, training_state=training_state, meta=meta)
    return out_dir / CHECKPOINT


def _data_description(data: WordData | None) -> dict[str, Any] | None:
    """What identifies the training words: None for fresh words drawn from the seed."""
    if data is None:
        return None
    shape = {"group": data.group, "count": int(data.inputs.shape[0]), "length": int(data.inputs.shape[1])}
    return {**shape, "inputs_sha256": _inputs_digest(data.inputs)}


def _inputs_digest(inputs: np.ndarray, rows_per_chunk: int = 65536) -> str:
    """SHA-256 of the words' element indices (as little-endian int64, whatever the file's
    dtype), read in chunks so that a memory-mapped file is not loaded whole. The targets
    follow from the inputs and the group."""
    digest = hashlib.sha256()
    for start in range(0, inputs.shape[0], rows_per_chunk):
        digest.update(np.ascontiguousarray(inputs[start:start + rows_per_chunk], dtype="<i8").tobytes())
    return digest.hexdigest()


def _check_same_data(checkpoint: Path, data: WordData | None) -> None:
    # Other words would silently change every batch after the resume.
    saved, given = read_meta(checkpoint).get("data"), _data_description(data)
    if isinstance(saved, dict) and given is not None and "inputs_sha256" not in saved:
        given = {k: v for k, v in given.items() if k != "inputs_sha256"}  # a checkpoint from before the digest
    if saved != given:
        trained = f"a word file ({saved})" if saved else "fresh words"
        now = f"a word file ({given})" if given else "fresh words"
        raise CheckpointError(f"{checkpoint}: the run trained on {trained}; resuming on {now} would change its batches")


def resume_settings(out_dir: str | Path, overrides: dict[str, Any]) -> WordTrainConfig:
    """The training settings of the run in ``out_dir``, with ``overrides`` (e.g. more steps) applied."""
    checkpoint = Path(out_dir) / CHECKPOINT
    recover_replaced(checkpoint)
    if not checkpoint.is_dir():
        raise CheckpointError(f"{out_dir}: nothing to resume (no {CHECKPOINT} folder)")
    return WordTrainConfig.from_dict({**saved_settings(checkpoint, field_names(WordTrainConfig)), **overrides})


def _batches(
    config: WordTrainConfig, data: WordData | None, device: torch.device, start_step: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (input_ids, labels) batches from step ``start_step`` on: shuffled epochs over
    ``data``, or fresh words."""
    if data is not None:
        yield from file_batches(data, config.batch_size, config.seed, device, start_step)
        return
    group = get_group(config.group)
    for step in itertools.count(start_step):
        # Each step's words come from their own seed: the same step always sees the same batch.
        inputs, targets = generate_words(
            group, config.train_length, config.batch_size, seed=_step_seed(config.seed, step), hard_prob=config.hard_prob
        )
        yield _to_tensors(inputs, targets, device)


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def file_batches(
    data: WordData, batch_size: int, seed: int, device, start: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (input_ids, labels) batches from a word file, from batch ``start`` on: a seeded
    shuffle per epoch, rows of a batch read in sorted order; labels derived here when the
    file does not store them."""
    count = data.inputs.shape[0]
    if count < batch_size:
        raise ValueError(f"training file has {count} sequences, fewer than the batch size {batch_size}")
    per_epoch = count // batch_size
    epoch, skip = divmod(start, per_epoch)
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(count)
        for start_row in range(skip * batch_size, per_epoch * batch_size, batch_size):
            rows = np.sort(order[start_row : start_row + batch_size])  # sorted rows read a memory map faster
            yield _to_tensors(data.inputs[rows], data.targets[rows], device)
        epoch, skip = epoch + 1, 0


def _to_tensors(inputs: np.ndarray, targets: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(inputs.astype(np.int64)).to(device),
        torch.from_numpy(targets.astype(np.int64)).to(device),
    )
