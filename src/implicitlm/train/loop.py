"""The training loop, step by step, apart from how the trainer sets a run up.

Per step: enter the curriculum's phase, forward and backward (``forward_backward``), clip,
check that loss and gradient are finite before the update, step optimiser and scheduler,
log, and checkpoint on schedule or on a stop signal. What the run brings (its batches and
gradient accumulation, its checkpoint writer, held-out evaluation, the metrics of its
task) comes in as a ``TrainingTask``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from .curriculum import Curriculum, Phase
from ..core.errors import NumericalFault
from .guard import (
    StopSignals, TrainingInterrupted, agreed_count, check_finite, stop_on_numerical_fault, stop_on_write_failure,
    stop_requested,
)
from .run_log import RunLog


@dataclass
class StepOutcome:
    """One optimiser step's forward and backward: the loss over the whole (global) batch,
    the last forward's output, this process's count of non-finite fixed-point images, the
    tokens the step consumed, what the task's metrics need besides (word labels), and the
    terms of a loss made of several (the few-pass stage's), to log.
    ``recheck()``: the loss and non-finite count of the step's (last) batch again, under the
    current weights: how the loop tries the updated weights before it checkpoints them."""

    loss: float
    output: Any
    non_finite: torch.Tensor
    tokens: int
    recheck: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    labels: torch.Tensor | None = None
    terms: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainingTask:
    """What a trainer gives the loop.

    ``forward_backward(model, phase)``: one step's gradients, accumulated, by the loss of
    the curriculum's ``phase``. ``task_metrics(outcome)``:
    the metrics only this task has (accuracy, perplexity). ``save(step)``: write a
    checkpoint after ``step`` steps, collectively; returns its path. ``evaluate(step)``:
    held-out metrics due after ``step``, or None. ``checkpoint_every``: 0 for only at the end.
    """

    curriculum: Curriculum
    forward_backward: Callable[[torch.nn.Module, Phase], StepOutcome]
    task_metrics: Callable[[StepOutcome], dict[str, Any]]
    save: Callable[[int], Path]
    grad_clip: float
    log_every: int
    checkpoint_every: int
    evaluate: Callable[[int], dict[str, Any] | None] = lambda step: None
    description: str = "train"


def run_training(
    task: TrainingTask,
    accelerator,
    model,
    optimizer,
    scheduler,
    out_dir: Path,
    start_step: int,
    last_checkpoint: Path | None,
    progress: bool,
) -> dict[str, Any]:
    """Steps ``start_step`` .. the curriculum's end; returns the last logged metrics, the last
    held-out ones, and the ``steps``, ``tokens`` and ``seconds`` this call trained. A resumed
    run (``start_step`` > 0) first drops the log records the interrupted run wrote after
    its checkpoint. Raises ``TrainingInterrupted`` after the checkpoint a stop signal asks
    for, and ``NumericalFault`` before an update that a non-finite number would poison.
    Without ``progress`` (bars), a line of step, loss, rate and speed every ``log_every``
    steps on stdout; a held-out evaluation is a line either way (beside the bars, on stderr)."""
    core = accelerator.unwrap_model(model)
    total = task.curriculum.total_steps
    main = accelerator.is_main_process
    bar = tqdm(range(start_step, total), initial=start_step, total=total, desc=task.description,
               disable=not progress or not main)
    phase, metrics, held_out_last, started, tokens = None, {}, {}, time.perf_counter(), 0
    model.train()
    log = RunLog(out_dir, accelerator, keep_before_step=start_step if start_step else None)
    # Beside the bars, where they are drawn; without them, a log of the run's output, as its summary.
    lines = sys.stderr if progress else sys.stdout
    with log, StopSignals() as stop:
        for step in bar:
            phase = task.curriculum.phase_at(step)
            with stop_on_numerical_fault(step, last_checkpoint):
                outcome = task.forward_backward(model, phase)
                grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), task.grad_clip))
                check_finite(outcome.loss, grad_norm, agreed_count(outcome.non_finite, accelerator))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += outcome.tokens
            if step == start_step and progress and main:
                tqdm.write(pace(time.perf_counter() - started, total - step - 1), file=sys.stderr)
            last = step == total - 1
            if step % task.log_every == 0 or last:
                metrics = {
                    **task.task_metrics(outcome), **outcome.terms, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0],
                    "phase": phase.name, "tokens_per_s": tokens / (time.perf_counter() - started),
                }
                if outcome.output.fixed_point is not None:
                    metrics.update(outcome.output.fixed_point.summary(),
                                   train_max_iter=core.fixed_point_options(phase.fixed_point).train_max_iter)
                log.write(step, metrics)
                bar.set_postfix(_postfix(metrics))
                if main and not progress:
                    tqdm.write(step_line(step, total, metrics), file=lines)
            held_out = task.evaluate(step)
            if held_out:
                log.write(step, held_out)
                held_out_last = held_out
                if main:
                    tqdm.write(held_out_line(step, held_out), file=lines)
            signal_number = stop_requested(stop, accelerator)
            periodic = task.checkpoint_every and (step + 1) % task.checkpoint_every == 0
            if signal_number or periodic or last:
                check_updated_weights(model, outcome.recheck, accelerator, step, last_checkpoint)
                with stop_on_write_failure(last_checkpoint):
                    last_checkpoint = task.save(step + 1)
            if signal_number:
                raise TrainingInterrupted(signal_number, step + 1, last_checkpoint)
    seconds = time.perf_counter() - started
    return {**metrics, **held_out_last, "steps": total - start_step, "tokens": tokens, "seconds": seconds}


def step_line(step: int, total: int, metrics: dict[str, Any]) -> str:
    """A logged step as one plain line, for a run without progress bars."""
    return (f"step {step + 1:,}/{total:,}: loss {metrics['loss']:.4f}, lr {metrics['lr']:.2e}, "
            f"{metrics['tokens_per_s']:,.0f} tokens/s")


def held_out_line(step: int, held_out: dict[str, float]) -> str:
    return f"step {step + 1:,}: held-out loss {held_out['test_loss']:.4f}, perplexity {held_out['test_ppl']:.2f}"


def chunk_evaluations_at(model, train_length: int) -> None:
    """Make ``train_length`` the chunk length of the model's simultaneous evaluations,
    unless one was set: beyond the length it trained at, a whole-sequence solve needs
    iterations in proportion to the length, and chunks of it converge as training did."""
    if model.config.implicit and not model.solver.options.chunk_length:
        model.set_fixed_point_options(chunk_length=train_length)


def check_updated_weights(model, recheck, accelerator, step: int, last_checkpoint: Path | None) -> None:
    """Before a checkpoint is written and called good: the weights the update produced are
    finite, and the step's batch gives a finite loss under them. An update can leave finite
    but useless weights (a huge learning rate: 1e28 everywhere) that only the next forward
    shows; checkpointed, they would replace the last good checkpoint."""
    bad_tensors = sum(int(not bool(torch.isfinite(p).all())) for p in model.parameters())
    problem = f"{bad_tensors} weight tensor(s) hold NaN or Inf" if agreed_count(torch.tensor(bad_tensors), accelerator) else None
    if problem is None:
        try:
            with torch.no_grad():
                loss, non_finite = recheck()
            failed = int(not bool(torch.isfinite(loss))) + int(non_finite)
        except NumericalFault:  # a solve with no finite iterate at all
            failed = 1
        if agreed_count(torch.tensor(failed), accelerator):
            problem = "the step's batch gives a NaN or infinite loss or fixed point under them"
    if problem:
        kept = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint had been written"
        raise NumericalFault(f"step {step}: the weights after its update are unusable ({problem}); not checkpointed; {kept}")


def pace(first_step_seconds: float, steps_left: int) -> str:
    """The first step's time and what the rest will take at that pace."""
    left = duration(first_step_seconds * steps_left)
    return f"the first step took {first_step_seconds:.1f} s; the {steps_left:,} steps left take about {left}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _postfix(metrics: dict[str, Any]) -> dict[str, str]:
    shown = {"loss": f"{metrics['loss']:.3f}"}
    if "accuracy" in metrics:
        shown["acc"] = f"{metrics['accuracy']:.3f}"
    return {**shown, "phase": metrics["phase"]}
