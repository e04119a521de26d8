"""Language-model training on packed token shards, on accelerate (one process, DDP or FSDP).

One optimiser step takes a global batch of ``batch_tokens`` tokens: ``micro_batch_size``
windows of ``sequence_length`` tokens per process and micro-step, accumulated over as many
micro-steps as that takes. Launched with ``torchrun``, the same code runs data-parallel:
accelerate sets up the process group and wraps the model; each process reads its own
rows of every global batch.

The curriculum is bounded (4+1) for ``bounded_fraction`` of the steps, then free (24+4 /
32+4 at tol 0.05). A run resumes exactly from its latest checkpoint: weights, optimiser,
scheduler, sampler position and RNG state are all restored, so the loss sequence after a
resume is the one the uninterrupted run would have produced.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.shards import TokenSampler, TokenShards, evaluation_windows
from ..deq import penalised
from ..data.tokenizer import load_tokenizer
from ..eval.perplexity import perplexity
from ..eval.plots import plot_learning_curves
from ..eval.records import make_record, write_record
from ..models.loss import token_cross_entropy
from ..core.schema import (
    NON_NEGATIVE, POSITIVE, SEED, UNIT_INTERVAL, OptionError, Rule, at_least, check_dataclass, check_known_keys,
    field_names, one_of,
)
from .checkpoint import (
    CheckpointError,
    applying_training_state,
    latest_checkpoint,
    prune_checkpoints,
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

LOGGER = logging.getLogger("implicitlm")
DISTRIBUTED = ("ddp", "fsdp")
# The defaults are the paper's GPU settings; on a CPU a step of them takes minutes.
PAPER_SCALE_DEFAULTS = ("batch_tokens", "sequence_length")
CHECKPOINTS = "checkpoints"
TRAINING_STATE_KEYS = ("optimizer", "scheduler", "sampler", "torch_rng")


@dataclass(frozen=True)
class LMTrainConfig:
    sequence_length: int = 2048
    batch_tokens: int = 2**20
    micro_batch_size: int = 8
    total_steps: int = 1000
    lr: float = 3e-3
    min_lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 100
    decay_fraction: float = 0.1
    grad_clip: float = 1.0
    # Curriculum (implicit models): bounded for this share of the steps, then free.
    bounded_fraction: float = 0.9
    bounded_iters: int = 4
    bounded_phantom_steps: int = 1
    free_iters: int = 24
    free_phantom_steps: int = 4
    free_tol: float = 0.05
    precision: str = "auto"
    distributed: str = "ddp"
    activation_checkpointing: bool = False
    compile: bool = False
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    eval_batches: int = 8
    checkpoint_every: int = 100
    keep_checkpoints: int = 2

    # The ranges of the fields above; their types are the annotations.
    FIELD_RULES = {
        "sequence_length": at_least(1), "batch_tokens": at_least(1), "micro_batch_size": at_least(1),
        "total_steps": at_least(1), "lr": POSITIVE, "min_lr": NON_NEGATIVE,
        "betas": Rule("in [0, 1)", lambda betas: all(0 <= beta < 1 for beta in betas)),
        "weight_decay": NON_NEGATIVE, "warmup_steps": NON_NEGATIVE, "decay_fraction": UNIT_INTERVAL,
        "grad_clip": POSITIVE, "bounded_fraction": UNIT_INTERVAL, "bounded_iters": NON_NEGATIVE,
        "bounded_phantom_steps": at_least(1), "free_iters": NON_NEGATIVE, "free_phantom_steps": at_least(1),
        "free_tol": POSITIVE, "distributed": one_of(*DISTRIBUTED), "seed": SEED, "log_every": at_least(1),
        "eval_every": NON_NEGATIVE, "eval_batches": at_least(1), "checkpoint_every": at_least(1),
        "keep_checkpoints": at_least(1),
    }
    # What each field means, for --help.
    FIELD_HELP = {
        "sequence_length": "tokens per training sequence (the paper: 2048)",
        "batch_tokens": "tokens per optimiser step, over all processes and micro-batches (the paper: 2^20)",
        "micro_batch_size": "sequences per forward on each process; batch_tokens is reached by accumulation",
        "total_steps": "optimiser steps",
        "lr": "peak learning rate (AdamW)",
        "min_lr": "learning rate at the end of the decay",
        "betas": "AdamW betas",
        "weight_decay": "AdamW weight decay",
        "warmup_steps": "steps of linear warm-up from 0 to lr",
        "decay_fraction": "share of all steps, at the end, over which the rate falls to min_lr (1 - sqrt)",
        "grad_clip": "gradient norm clipped to this",
        "bounded_fraction": "implicit: share of the steps in the bounded phase; the rest is free",
        "bounded_iters": "implicit: solver iterations per bounded step (the paper's 4)",
        "bounded_phantom_steps": "implicit: phantom-gradient steps per bounded step (the paper's 1)",
        "free_iters": "implicit: most solver iterations per free step",
        "free_phantom_steps": "implicit: phantom-gradient steps per free step",
        "free_tol": "implicit: relative residual at which a free-phase solve stops",
        "precision": "auto (bf16 autocast on CUDA, full precision elsewhere), float32, bfloat16, float16",
        "distributed": "under torchrun: ddp or fsdp",
        "activation_checkpointing": "recompute each block in the backward pass (less memory, one more forward)",
        "compile": "torch.compile the stack",
        "seed": "seed of initialisation and of the data order",
        "log_every": "steps between metrics lines",
        "eval_every": "steps between validation perplexities (0: none)",
        "eval_batches": "micro-batches per validation",
        "checkpoint_every": "steps between checkpoints",
        "keep_checkpoints": "checkpoints kept (the oldest are removed)",
    }

    def __post_init__(self) -> None:
        check_dataclass(self, "training option")
        check_precision(self.precision)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "LMTrainConfig":
        check_known_keys(values, field_names(cls), "training option")
        return cls(**values)

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimiser step, so that one step sees ``batch_tokens`` tokens."""
        per_micro_step = self.sequence_length * self.micro_batch_size * world_size
        if self.batch_tokens % per_micro_step:
            raise OptionError(
                f"batch_tokens={self.batch_tokens} is not a multiple of sequence_length x micro_batch_size x "
                f"processes = {per_micro_step}"
            )
        return self.batch_tokens // per_micro_step

    def gradient_passes(self, implicit: bool) -> int:
        """Passes of the stack whose graph a step keeps: the phantom steps (one for explicit models)."""
        return max(self.bounded_phantom_steps, self.free_phantom_steps) if implicit else 1

    def curriculum(self, implicit: bool) -> Curriculum:
        if not implicit:
            return Curriculum((Phase("explicit", self.total_steps),))
        bounded_steps = round(self.bounded_fraction * self.total_steps)
        return Curriculum.unroll_bounded_free(
            0,
            bounded_steps,
            self.total_steps - bounded_steps,
            bounded=(self.bounded_iters, self.bounded_phantom_steps),
            free=(self.free_iters, self.free_phantom_steps),
            free_tol=self.free_tol,
        )


def train_lm(
    model,
    config: LMTrainConfig,
    data_dir: str | Path,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train ``model`` in place on the shards in ``data_dir``; returns the last logged metrics.

    Checkpoints go to ``out_dir/checkpoints/step_NNNNNNN`` (the last ``keep_checkpoints``
    kept), logs to ``out_dir/metrics.jsonl`` and ``out_dir/tensorboard``. ``resume``
    continues from the latest checkpoint in ``out_dir`` (the model's weights are replaced
    by the checkpoint's); a fresh run refuses an ``out_dir`` that holds an earlier run, or,
    with ``overwrite``, removes that run first.
    """
    out_dir = Path(out_dir)
    accelerator = _accelerator(config, model, out_dir)
    with run_folder_lock(out_dir, enabled=accelerator.is_main_process):
        return _train_lm(accelerator, model, config, Path(data_dir), out_dir, resume, progress, overwrite)


def _train_lm(
    accelerator, model, config: LMTrainConfig, data_dir: Path, out_dir: Path, resume: bool, progress: bool, overwrite: bool
) -> dict[str, Any]:
    if not resume:
        # Every process looks before the main one clears, so that all see the same folder.
        refuse_earlier_run(out_dir, overwrite)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            clear_earlier_run(out_dir)
        accelerator.wait_for_everyone()
    require_training(
        model, config.micro_batch_size, config.sequence_length, config.gradient_passes(model.config.implicit)
    )
    chunk_evaluations_at(model, config.sequence_length)
    torch.manual_seed(config.seed)
    shards = TokenShards(data_dir, "train")
    _check_vocabulary(model, shards)
    mark_end_of_text(model, shards.eos_token_id)
    tokenizer = _local_tokenizer(shards)
    accumulation = config.accumulation_steps(accelerator.num_processes)
    sampler = TokenSampler(
        shards, config.sequence_length, config.micro_batch_size, seed=config.seed,
        rank=accelerator.process_index, world_size=accelerator.num_processes,
    )
    start_step, state, checkpoint = 0, None, None
    if resume:
        checkpoint = _latest(out_dir)
        start_step, state = restore_weights(model, checkpoint, TRAINING_STATE_KEYS)
    if config.activation_checkpointing:
        model.activation_checkpointing_enable()
    if config.compile:
        compile_stack(model)
    model = accelerator.prepare(model)
    core = accelerator.unwrap_model(model)
    optimizer = accelerator.prepare(
        torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas)
    )
    decay_steps = round(config.decay_fraction * config.total_steps)
    # Not handed to accelerate, which would step it once per process.
    scheduler = warmup_stable_sqrt_decay(
        optimizer, config.warmup_steps, config.total_steps, decay_steps, config.min_lr / config.lr
    )
    if state is not None:
        with applying_training_state(checkpoint, optimizer):
            _restore_training_state(state, accelerator, model, optimizer, scheduler, sampler, config)
    test = TokenShards(data_dir, "test", verify=True) if config.eval_every else None
    batches = iter(sampler)
    if accelerator.is_main_process:
        if progress:
            tqdm.write(step_cost(config, accumulation, accelerator.num_processes), file=sys.stderr)
        warning = unsuited_defaults(config, on_gpu=torch.cuda.is_available())
        if warning:
            LOGGER.warning(warning)

    def evaluate(step: int) -> dict[str, float] | None:
        due = test is not None and ((step + 1) % config.eval_every == 0 or step == config.total_steps - 1)
        return _held_out(core, test, config) if due else None

    task = TrainingTask(
        curriculum=config.curriculum(core.config.implicit),
        forward_backward=lambda model: _optimiser_step(accelerator, model, batches, accumulation, config.batch_tokens),
        task_metrics=lambda outcome: {"loss": outcome.loss, "ppl": math.exp(min(outcome.loss, 50.0))},
        save=lambda step: _checkpoint(accelerator, model, optimizer, scheduler, sampler, out_dir, step, config, tokenizer),
        grad_clip=config.grad_clip, log_every=config.log_every, checkpoint_every=config.checkpoint_every,
        evaluate=evaluate,
    )
    metrics = run_training(task, accelerator, model, optimizer, scheduler, out_dir, start_step, checkpoint, progress)
    if accelerator.is_main_process:
        _write_training_record(core, out_dir, config, latest_checkpoint(out_dir / CHECKPOINTS))
    return metrics


def step_cost(config: LMTrainConfig, accumulation: int, processes: int) -> str:
    """What one optimiser step is, said before the first one."""
    total = config.total_steps * config.batch_tokens
    return (
        f"one step: {config.batch_tokens:,} tokens = {accumulation} micro-batch(es) of {config.micro_batch_size} x "
        f"{config.sequence_length} tokens on each of {processes} process(es); "
        f"{config.total_steps:,} steps = {total:,} tokens"
    )


def unsuited_defaults(config: LMTrainConfig, on_gpu: bool) -> str | None:
    """A warning where a size left at its default (the paper's GPU setting) cannot suit a
    CPU, naming the option to set; None where nothing is amiss."""
    if on_gpu:
        return None
    defaults = [name for name in PAPER_SCALE_DEFAULTS if getattr(config, name) == getattr(LMTrainConfig, name)]
    if not defaults:
        return None
    settings = ", ".join(f"{name}={getattr(config, name):,}" for name in defaults)
    return (
        f"{settings}: the paper's GPU setting (the default), minutes per step on a CPU; set "
        + " and ".join(f"--train {name}=..." for name in defaults)
        + " or start from the lm_wikitext2 preset (--config lm_wikitext2)"
    )


def held_out_curve(run_dir: str | Path, batch_tokens: int) -> list[tuple[int, float]]:
    """(training tokens, held-out perplexity) at each held-out evaluation a run logged."""
    points = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "test_ppl" in record:
            points.append(((record["step"] + 1) * batch_tokens, record["test_ppl"]))
    return points


def _write_training_record(core, out_dir: Path, config: LMTrainConfig, checkpoint: Path) -> None:
    """The held-out curve as a record (``lm_training.json`` + ``.png``), so that
    ``implicitlm report`` overlays the curves of several runs."""
    points = held_out_curve(out_dir, config.batch_tokens)
    if not points:
        return
    tokens, ppl = [x for x, _ in points], [y for _, y in points]
    axes = {"x": "training tokens", "y": "held-out perplexity", "yscale": "log"}
    record = make_record(
        "lm_training", checkpoint, core, {"test_ppl": ppl[-1], "train_tokens": config.total_steps * config.batch_tokens},
        curves=[{"label": "held-out perplexity", "x": tokens, "y": ppl}], axes=axes,
    )
    write_record(out_dir, record)
    plot_learning_curves({out_dir.name: points}, out_dir / "lm_training.png", "held-out perplexity", axes["x"], axes["y"])


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


def _accelerator(config: LMTrainConfig, model, out_dir: Path):
    plugin = None
    if config.distributed == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=list(model._no_split_modules),
            state_dict_type="FULL_STATE_DICT",
        )
    # cpu=True is what makes accelerate set up a (gloo) process group for torchrun on CPU.
    return accelerator_for(
        config.precision, fsdp_plugin=plugin, cpu=not torch.cuda.is_available(), **tracking_options(out_dir)
    )


def _check_vocabulary(model, shards: TokenShards) -> None:
    if shards.vocab_size > model.config.vocab_size:
        raise OptionError(
            f"the shards' tokenizer has {shards.vocab_size} tokens, more than the model's vocab_size "
            f"{model.config.vocab_size}"
        )


def _optimiser_step(accelerator, model, batches, accumulation: int, batch_tokens: int) -> StepOutcome:
    """Forward and backward over ``accumulation`` micro-batches; gradients are synchronised
    between processes on the last one only. The loss is the step's mean over all processes."""
    total = torch.zeros((), device=accelerator.device)
    output, non_finite = None, torch.zeros((), dtype=torch.long, device=accelerator.device)
    for micro_step in range(accumulation):
        window = next(batches).to(accelerator.device)
        last = micro_step == accumulation - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            output = model(window[:, :-1])
            # Every micro-batch holds the same number of tokens, so the mean of the
            # micro-batch means is the mean over the whole global batch.
            cross_entropy = token_cross_entropy(output.logits, window[:, 1:], "aligned")
            accelerator.backward(penalised(cross_entropy, output.fixed_point) / accumulation)
        total += cross_entropy.detach() / accumulation
        non_finite += non_finite_images(output)

    def recheck():
        again = model(window[:, :-1])
        return token_cross_entropy(again.logits, window[:, 1:], "aligned"), non_finite_images(again)

    return StepOutcome(accelerator.reduce(total, reduction="mean").item(), output, non_finite, batch_tokens, recheck)


def _held_out(core, test: TokenShards, config: LMTrainConfig) -> dict[str, float]:
    windows = evaluation_windows(test, config.sequence_length, config.micro_batch_size)
    # No warning at every evaluation: the share goes to the logs as test_fp_not_converged_share.
    result = perplexity(core, itertools.islice(windows, config.eval_batches), warn=False)
    held_out = {"test_loss": result["loss"], "test_ppl": result["perplexity"]}
    if "fp_not_converged_share" in result:
        held_out["test_fp_not_converged_share"] = result["fp_not_converged_share"]
    return held_out


def mark_end_of_text(model, eos_token_id: int) -> None:
    """The shards' eos id in the model's config and generation config, so that a trained
    checkpoint's ``generate()`` stops at the end of a text and pads finished rows with it
    (the shards have no padding token of their own)."""
    for config in (model.config, model.generation_config):
        config.eos_token_id = eos_token_id
        config.pad_token_id = eos_token_id


def _local_tokenizer(shards: TokenShards):
    """The shards' tokenizer when it is a local folder (then checkpoints carry a copy, since
    the folder may not travel with them), else None: a hub name stays findable."""
    return load_tokenizer(shards.tokenizer) if Path(shards.tokenizer).is_dir() else None


def _checkpoint(accelerator, model, optimizer, scheduler, sampler, out_dir: Path, step: int, config, tokenizer) -> Path:
    path = out_dir / CHECKPOINTS / f"step_{step:07d}"
    weights = accelerator.get_state_dict(model)  # gathered to the main process under FSDP
    optimizer_state = _optimizer_state(accelerator, model, optimizer, config)
    if accelerator.is_main_process:
        training_state = {
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "sampler": sampler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        meta = {"step": step, "train": asdict(config), "processes": accelerator.num_processes}
        core = accelerator.unwrap_model(model)
        save_checkpoint(path, core, training_state=training_state, meta=meta, weights=weights, tokenizer=tokenizer)
        prune_checkpoints(out_dir / CHECKPOINTS, config.keep_checkpoints)
    accelerator.wait_for_everyone()
    return path


def _optimizer_state(accelerator, model, optimizer, config: LMTrainConfig) -> dict[str, Any]:
    if config.distributed == "fsdp" and accelerator.num_processes > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer.optimizer, options=options)
    return optimizer.state_dict()


def _latest(out_dir: Path) -> Path:
    checkpoint = latest_checkpoint(out_dir / CHECKPOINTS)
    if checkpoint is None:
        raise CheckpointError(f"{out_dir}: nothing to resume (no checkpoint in {out_dir / CHECKPOINTS})")
    return checkpoint


def _restore_training_state(state: dict[str, Any], accelerator, model, optimizer, scheduler, sampler, config) -> None:
    if config.distributed == "fsdp" and accelerator.num_processes > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_optimizer_state_dict(model, optimizer.optimizer, state["optimizer"], options=options)
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    apply_current_rate(scheduler, config.lr)
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["torch_rng"])


def resume_config(out_dir: str | Path, overrides: dict[str, Any]) -> LMTrainConfig:
    """The training settings of the run in ``out_dir``, with ``overrides`` (e.g. more steps,
    a later switch to the free phase) applied."""
    return LMTrainConfig.from_dict({**saved_settings(_latest(Path(out_dir)), field_names(LMTrainConfig)), **overrides})
