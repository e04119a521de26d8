"""The one trainer, for every task, on accelerate: one process, or DDP / FSDP under torchrun.

One optimiser step takes a global batch: ``batch_size`` sequences per process and
micro-step, accumulated over as many micro-steps as ``batch_tokens`` asks (one when it is
0). Under torchrun the same code runs data-parallel: accelerate sets up the process group
and wraps the model; each process reads its own rows of every global batch.

The curriculum (``curriculum.py``) is the unroll warm-up (if any), then bounded (4+1) for
``bounded_fraction`` of the remaining steps, then free, then the contraction and few-pass
stages (if any, ``few_pass.py``). A run resumes exactly from its latest checkpoint:
weights, optimiser, scheduler, batch position and RNG state are all restored, so the
losses after a resume are those the uninterrupted run would have produced.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..core.errors import OptionError
from ..core import migrations
from ..core.run_folder import (
    CHECKPOINTS, link_latest_checkpoint, read_trainer_meta, remove_stale_temporaries,
)
from ..core.schema import field_names
from ..data.words import WordData
from ..deq import penalised
from ..models.loss import token_cross_entropy
from ..tasks import TRAINING
from ..tasks.lm import TokenBatches
from ..tasks.words import WordBatches
from .checkpoint import (
    RUN_HISTORY, CheckpointError, WarmStart, applying_training_state, prune_checkpoints, restore_weights, run_checkpoint,
    save_checkpoint, saved_settings,
)
from .config import TrainConfig
from .curriculum import Phase
from .few_pass import few_pass_micro_step
from .guard import non_finite_images
from .held_out import held_out_metrics, write_training_record
from .loop import StepOutcome, TrainingTask, chunk_evaluations_at, run_training
from .run_log import earlier_run_set_aside, refuse_earlier_run, run_folder_lock, tracking_options
from .schedule import config_plan, restore_schedule
from .speed import accelerator_for, compile_stack
from .step_memory import require_training

LOGGER = logging.getLogger("implicitlm")
TRAINING_STATE_KEYS = ("optimizer", "scheduler", "torch_rng")


def train(
    model,
    config: TrainConfig,
    out_dir: str | Path,
    data: WordData | str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    description: str = "train",
    warm_start: WarmStart | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place; returns the last logged metrics.

    ``data``: for ``task="words"`` a word file's ``WordData``, or None for fresh words drawn
    from the seed; for ``task="lm"`` the folder of token shards (``implicitlm corpus build``).
    Checkpoints go to ``out_dir/checkpoints/step_NNNNNNN`` (the last ``keep_checkpoints``
    kept), logs to ``out_dir/metrics.jsonl`` and ``out_dir/tensorboard``. ``resume``
    continues from the latest checkpoint in ``out_dir`` (its weights replace the model's); a
    fresh run refuses an ``out_dir`` that holds an earlier run, or, with ``overwrite``,
    replaces it (kept until the new run's first checkpoint). A SIGTERM or SIGINT ends the run after the current step with a
    checkpoint (``TrainingInterrupted``); a non-finite loss or gradient ends it before the
    update (``NumericalFault``), leaving the last checkpoint as it was. ``warm_start``: where
    the model's weights came from (``checkpoint.warm_start``); the batches go on from that
    run's position when they can, so that on the same data the new run sees further tokens.
    ``device``: where it trains (cpu, cuda, cuda:1; default: the GPU where torch sees one, else
    the CPU; under torchrun, each process the GPU of its local rank).
    """
    out_dir = Path(out_dir)
    accelerator = _accelerator(config, model, out_dir, device)
    with run_folder_lock(out_dir, enabled=accelerator.is_main_process):
        if accelerator.is_main_process:
            stale = remove_stale_temporaries(out_dir)
            if stale:
                names = ", ".join(str(path.relative_to(out_dir)) for path in stale)
                LOGGER.warning(f"{out_dir}: removed {len(stale)} temporary file(s) a stopped run left: {names}")
        if not resume:
            # Every process looks before the main one moves the earlier run aside.
            refuse_earlier_run(out_dir, overwrite)
            accelerator.wait_for_everyone()
        with earlier_run_set_aside(out_dir, enabled=accelerator.is_main_process and not resume):
            accelerator.wait_for_everyone()
            return _train(accelerator, model, config, data, out_dir, resume, progress, description, warm_start)


def _train(
    accelerator, model, config: TrainConfig, data, out_dir: Path, resume: bool, progress: bool, description: str,
    warm_start: WarmStart | None,
) -> dict[str, Any]:
    require_training(model.config, config, device=str(accelerator.device))
    chunk_evaluations_at(model, config.sequence_length)
    torch.manual_seed(config.seed)
    batches = _batches(config, data, accelerator)
    batches.prepare(model)
    accumulation = config.accumulation_steps(accelerator.num_processes)
    start_step, state, checkpoint = 0, None, None
    history = {} if warm_start is None else warm_start.history()
    if resume:
        checkpoint = run_checkpoint(out_dir)
        start_step, state = restore_weights(model, checkpoint, TRAINING_STATE_KEYS)
        _check_steps_left(checkpoint, start_step, config.total_steps)
        _check_same_data(checkpoint, batches)
        history = {key: value for key, value in read_trainer_meta(checkpoint).items() if key in RUN_HISTORY}
    elif warm_start is not None:
        _continue_batch_order(batches, warm_start)
    if config.activation_checkpointing:
        model.activation_checkpointing_enable()
    if config.compile:
        compile_stack(model)
    model = accelerator.prepare(model)
    core = accelerator.unwrap_model(model)
    optimizer = accelerator.prepare(
        torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas)
    )
    curriculum = config.curriculum(core.config.implicit)
    # Not handed to accelerate, which would step it once per process.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, config_plan(config))
    if state is not None:
        with applying_training_state(checkpoint, start_step, optimizer, scheduler):
            _restore_training_state(state, accelerator, model, optimizer, config)
            restore_schedule(
                scheduler, state["scheduler"], lambda: config_plan(checkpoint_config(checkpoint, {})), config.lr
            )
            batches.load_state_dict(state["sampler"])
    test = batches.held_out() if config.eval_every else None
    if accelerator.is_main_process:
        if progress:
            tqdm.write(step_cost(config, accumulation, accelerator.num_processes), file=sys.stderr)
        warning = unsuited_defaults(config, on_gpu=accelerator.device.type == "cuda")
        if warning:
            LOGGER.warning(warning)

    def evaluate(step: int) -> dict[str, float] | None:
        due = test is not None and ((step + 1) % config.eval_every == 0 or step == config.total_steps - 1)
        return held_out_metrics(core, test, config) if due else None

    task = TrainingTask(
        curriculum=curriculum,
        forward_backward=lambda model, phase: _optimiser_step(accelerator, model, batches, accumulation, phase),
        task_metrics=lambda outcome: _step_metrics(accelerator, batches, outcome),
        save=lambda step: _checkpoint(accelerator, model, optimizer, scheduler, batches, out_dir, step, config, history),
        grad_clip=config.grad_clip, log_every=config.log_every, checkpoint_every=config.checkpoint_every,
        evaluate=evaluate, description=description,
    )
    metrics = run_training(task, accelerator, model, optimizer, scheduler, out_dir, start_step, checkpoint, progress)
    if accelerator.is_main_process:
        tokens_per_step = config.tokens_per_micro_batch() * accumulation * accelerator.num_processes
        write_training_record(core, out_dir, config, tokens_per_step, run_checkpoint(out_dir))
    return metrics


def _batches(config: TrainConfig, data, accelerator) -> WordBatches | TokenBatches:
    return TRAINING[config.task].batches_class().for_training(
        config, data, rank=accelerator.process_index, world_size=accelerator.num_processes
    )


def step_cost(config: TrainConfig, accumulation: int, processes: int) -> str:
    """What one optimiser step is, said before the first one."""
    per_step = config.tokens_per_micro_batch() * accumulation * processes
    return (
        f"one step: {per_step:,} tokens = {accumulation} micro-batch(es) of {config.batch_size} x "
        f"{config.sequence_length} tokens on each of {processes} process(es); "
        f"{config.total_steps:,} steps = {config.total_steps * per_step:,} tokens"
    )


def unsuited_defaults(config: TrainConfig, on_gpu: bool) -> str | None:
    """A warning where a size the task left at its default (the paper's GPU setting) cannot
    suit a CPU, naming the option to set; None where nothing is amiss."""
    if on_gpu:
        return None
    paper_scale = TRAINING[config.task].batches_class().PAPER_SCALE_DEFAULTS
    defaults = [name for name in paper_scale if getattr(config, name) == getattr(TrainConfig, name)]
    if not defaults:
        return None
    settings = ", ".join(f"{name}={getattr(config, name):,}" for name in defaults)
    return (
        f"{settings}: the paper's GPU setting (the default), minutes per step on a CPU; set "
        + " and ".join(f"--train {name}=..." for name in defaults)
        + " or start from the lm_wikitext2 preset (--config lm_wikitext2)"
    )


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weight matrices (and the embedding), none on norm scales, biases,
    SSM parameters (A_log, D, dt_bias) and weight norm's magnitudes: those are scales whose
    size is their meaning, not capacity to regularise."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        magnitude = name.endswith("original0")  # weight norm's g
        (decay if param.ndim >= 2 and not magnitude else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _accelerator(config: TrainConfig, model, out_dir: Path, device: str | None):
    plugin = None
    if config.distributed == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=list(model._no_split_modules),
            state_dict_type="FULL_STATE_DICT",
        )
    return accelerator_for(config.precision, device, fsdp_plugin=plugin, **tracking_options(out_dir))


def _optimiser_step(accelerator, model, batches, accumulation: int, phase: Phase) -> StepOutcome:
    """Forward and backward over ``accumulation`` micro-batches; gradients are synchronised
    between processes on the last one only. The loss is the step's mean over all processes:
    the cross-entropy, at the fixed point or, in the few-pass stage, after its passes; every
    forward given the phase's fixed-point options."""
    total = torch.zeros((), device=accelerator.device)
    output, non_finite = None, torch.zeros((), dtype=torch.long, device=accelerator.device)
    tokens, terms = 0, {}
    for micro_step in range(accumulation):
        input_ids, labels = (tensor.to(accelerator.device) for tensor in next(batches))
        last = micro_step == accumulation - 1
        if phase.few_pass is not None:
            cross_entropy, step_terms, output = few_pass_micro_step(
                accelerator, model, input_ids, labels, phase.few_pass, 1 / accumulation, last, phase.fixed_point
            )
            for name, value in step_terms.items():
                terms[name] = terms.get(name, 0) + value / accumulation
        else:
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                output = model(input_ids, fixed_point=phase.fixed_point)
                # Every micro-batch holds the same number of labels, so the mean of the
                # micro-batch means is the mean over the whole global batch.
                cross_entropy = token_cross_entropy(output.logits, labels, "aligned")
                accelerator.backward(penalised(cross_entropy, output.fixed_point) / accumulation)
        total += cross_entropy.detach() / accumulation
        non_finite += non_finite_images(output)
        tokens += input_ids.numel() * accelerator.num_processes

    def recheck():
        again = model(input_ids, fixed_point=phase.fixed_point)
        return token_cross_entropy(again.logits, labels, "aligned"), non_finite_images(again)

    loss = accelerator.reduce(total, reduction="mean").item()
    terms = {name: accelerator.reduce(value, reduction="mean").item() for name, value in terms.items()}
    return StepOutcome(loss, output, non_finite, tokens, recheck, labels, terms)


def _step_metrics(accelerator, batches, outcome: StepOutcome) -> dict[str, float]:
    """The metrics of the step that only its task has (accuracy, perplexity)."""
    return batches.step_metrics(
        outcome.loss, outcome.output.logits, outcome.labels,
        lambda value: accelerator.reduce(value, reduction="mean").item(),
    )


def _checkpoint(
    accelerator, model, optimizer, scheduler, batches, out_dir: Path, step: int, config: TrainConfig,
    history: dict[str, Any],
) -> Path:
    path = out_dir / CHECKPOINTS / f"step_{step:07d}"
    weights = accelerator.get_state_dict(model)  # gathered to the main process under FSDP
    optimizer_state = _optimizer_state(accelerator, model, optimizer, config)
    if accelerator.is_main_process:
        training_state = {
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "sampler": batches.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        meta = {
            "step": step, "train": asdict(config), "processes": accelerator.num_processes,
            "data": batches.description(), **history,
        }
        core = accelerator.unwrap_model(model)
        save_checkpoint(path, core, training_state=training_state, meta=meta, weights=weights, tokenizer=batches.tokenizer)
        # Before the pruning: a link to a pruned checkpoint would lead nowhere meanwhile.
        link_latest_checkpoint(out_dir)
        prune_checkpoints(out_dir / CHECKPOINTS, config.keep_checkpoints)
    accelerator.wait_for_everyone()
    return path


def _sharded(accelerator, config: TrainConfig) -> bool:
    return config.distributed == "fsdp" and accelerator.num_processes > 1


def _optimizer_state(accelerator, model, optimizer, config: TrainConfig) -> dict[str, Any]:
    if _sharded(accelerator, config):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer.optimizer, options=options)
    return optimizer.state_dict()


def _restore_training_state(state: dict[str, Any], accelerator, model, optimizer, config) -> None:
    if _sharded(accelerator, config):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_optimizer_state_dict(model, optimizer.optimizer, state["optimizer"], options=options)
    else:
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])


def _continue_batch_order(batches, warm_start: WarmStart) -> None:
    """The batches from the position the warm start's run reached, when its batch order is
    this run's (the same seed, window length and number of windows); else from the start."""
    source = warm_start.checkpoint
    if warm_start.data_position is None:
        LOGGER.info(f"{source}: no batch position saved; the batches start from the beginning")
        return
    try:
        batches.load_state_dict(warm_start.data_position)
    except (KeyError, ValueError) as error:
        LOGGER.warning(f"{source}: its run's batch order is not this run's ({error}); the batches start from the beginning")
    else:
        LOGGER.info(f"{source}: the batches go on where its run stopped ({warm_start.data_position})")


def _check_steps_left(checkpoint: Path, step: int, total_steps: int) -> None:
    # A resume that trains nothing would end as a finished run does, and say nothing.
    if step >= total_steps:
        raise OptionError(
            f"{checkpoint}: the run is at step {step} already, and total_steps={total_steps}: nothing to train "
            f"(resume with total_steps above {step} to train further)"
        )


def _check_same_data(checkpoint: Path, batches) -> None:
    # Other data would silently change every batch after the resume.
    saved = read_trainer_meta(checkpoint).get("data")
    given = batches.description()
    comparable = migrations.data_description_before_digest(saved, given)
    if saved != comparable:
        fix = "resume without data" if saved is None else f"resume with data={batches.DATA_FORM}, the run's own"
        raise CheckpointError(
            f"{checkpoint}: the run trained on {batches.data_named(saved)}; "
            f"resuming on {batches.data_named(comparable)} would change its batches: {fix}", arguments=("data",),
        )
    if saved is None and given is not None:
        LOGGER.warning(f"{checkpoint}: written before runs recorded their data; the shards are not checked to be its own")


def resume_config(out_dir: str | Path, overrides: dict[str, Any]) -> TrainConfig:
    """The training settings of the run in ``out_dir`` (in today's spelling), with ``overrides``
    (e.g. more steps, a later switch to the free phase) applied."""
    return checkpoint_config(run_checkpoint(Path(out_dir)), overrides)


def checkpoint_config(checkpoint: Path, overrides: dict[str, Any]) -> TrainConfig:
    """The training settings a checkpoint recorded (in today's spelling), with ``overrides``;
    settings it lacks are refused rather than run at their defaults."""
    fields = field_names(TrainConfig)
    saved = saved_settings(checkpoint)
    task = saved.pop("task")
    missing = sorted(set(fields) - set(saved) - {"task"})
    if missing:
        raise CheckpointError(
            f"{checkpoint}: the training settings lack {', '.join(missing)}; a resume would run them at their defaults"
        )
    return TrainConfig.for_task(task, **{**saved, **overrides})
