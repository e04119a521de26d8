"""Training on word problems (state tracking), on accelerate.

Batches are either drawn from a word-problem file or generated on the fly from a seed
and the step number, so a run is reproducible and a resumed run sees the same batches.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from ..data.groups import get_group
from ..data.words import WordData, generate_words
from ..deq.options import check_known_keys, field_names
from .checkpoint import save_checkpoint
from .curriculum import Curriculum, Phase
from .run_log import RunLog
from .schedule import warmup_constant
from .speed import check_precision, compile_stack, resolve_precision


@dataclass(frozen=True)
class WordTrainConfig:
    group: str = "S3"
    train_length: int = 16
    batch_size: int = 128
    hard_prob: float | None = None
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
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

    def __post_init__(self) -> None:
        check_precision(self.precision)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "WordTrainConfig":
        check_known_keys(values, field_names(cls), "training option")
        return cls(**values)

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
) -> dict[str, float]:
    """Train ``model`` in place; returns the last logged metrics. Checkpoints go to
    ``out_dir/checkpoint``, logs to ``out_dir/metrics.jsonl`` and ``out_dir/tensorboard``."""
    out_dir = Path(out_dir)
    torch.manual_seed(config.seed)
    accelerator = Accelerator(mixed_precision=resolve_precision(config.precision))
    if config.compile:
        compile_stack(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_constant(config.warmup_steps))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    core = accelerator.unwrap_model(model)
    curriculum = config.curriculum(core.config.implicit)
    log = RunLog(out_dir, enabled=accelerator.is_main_process)
    batches = _batches(config, data, accelerator.device)
    phase, metrics = None, {}
    started, tokens = time.perf_counter(), 0
    bar = tqdm(range(curriculum.total_steps), desc=description, disable=not progress or not accelerator.is_main_process)
    model.train()
    for step in bar:
        if curriculum.phase_at(step) is not phase:
            phase = curriculum.phase_at(step)
            if core.config.implicit:
                core.set_fixed_point_options(**phase.fixed_point)
        input_ids, labels = next(batches)
        output = model(input_ids, labels=labels)
        accelerator.backward(output.loss)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += input_ids.numel()
        if step % config.log_every == 0 or step == curriculum.total_steps - 1:
            metrics = _step_metrics(output, labels, grad_norm, scheduler, phase, tokens, started)
            log.write(step, metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}", phase=phase.name)
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
            _checkpoint(accelerator, core, optimizer, scheduler, out_dir, step + 1, config)
    _checkpoint(accelerator, core, optimizer, scheduler, out_dir, curriculum.total_steps, config)
    log.close()
    return metrics


def _step_metrics(output, labels, grad_norm, scheduler, phase: Phase, tokens: int, started: float) -> dict[str, Any]:
    with torch.no_grad():
        accuracy = (output.logits.argmax(-1) == labels).float().mean().item()
    metrics = {
        "loss": output.loss.item(),
        "accuracy": accuracy,
        "grad_norm": float(grad_norm),
        "lr": scheduler.get_last_lr()[0],
        "phase": phase.name,
        "tokens_per_s": tokens / (time.perf_counter() - started),
    }
    if output.fixed_point is not None:
        metrics.update(output.fixed_point.summary())
    return metrics


def _checkpoint(accelerator, core, optimizer, scheduler, out_dir: Path, step: int, config: WordTrainConfig) -> None:
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        training_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        meta = {"step": step, "train": asdict(config)}
        save_checkpoint(out_dir / "checkpoint", core, training_state=training_state, meta=meta)


def _batches(
    config: WordTrainConfig, data: WordData | None, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (input_ids, labels) batches: shuffled epochs over ``data``, or fresh words."""
    if data is not None:
        yield from file_batches(data, config.batch_size, config.seed, device)
        return
    group = get_group(config.group)
    step = 0
    while True:
        # Each step's words come from their own seed: the same step always sees the same batch.
        inputs, targets = generate_words(
            group, config.train_length, config.batch_size, seed=_step_seed(config.seed, step), hard_prob=config.hard_prob
        )
        step += 1
        yield _to_tensors(inputs, targets, device)


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def file_batches(data: WordData, batch_size: int, seed: int, device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (input_ids, labels) batches from a word file: a seeded shuffle per epoch, rows
    of a batch read in sorted order; labels derived here when the file does not store them."""
    count = data.inputs.shape[0]
    if count < batch_size:
        raise ValueError(f"training file has {count} sequences, fewer than the batch size {batch_size}")
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(count)
        for start in range(0, count - batch_size + 1, batch_size):
            rows = np.sort(order[start : start + batch_size])  # sorted rows read a memory map faster
            yield _to_tensors(data.inputs[rows], data.targets[rows], device)
        epoch += 1


def _to_tensors(inputs: np.ndarray, targets: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(inputs.astype(np.int64)).to(device),
        torch.from_numpy(targets.astype(np.int64)).to(device),
    )
