"""The one set of training options, for every task (word problems and language modelling).

The class defaults are the paper's language-model settings; a task replaces some of them
with its own (its ``Training.defaults`` in the table of tasks, ``tasks.TASKS``: word problems
train short words in large batches, without weight decay). A preset's values go on top of
those, the command line's on top of the preset's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.migrations import refuse_renamed_training_options
from ..core.options import Options
from ..core.schema import (
    NON_NEGATIVE, POSITIVE, SEED, UNIT_INTERVAL, OptionError, Rule, at_least, check_known_keys, field_names, one_of,
)
from ..deq.options import pass_count
from ..tasks import TRAINING
from .curriculum import Curriculum, Phase
from .few_pass import FewPassLoss

DISTRIBUTED = ("ddp", "fsdp")
PRECISIONS = ("auto", "no", "bf16")


@dataclass(frozen=True)
class TrainConfig(Options):
    task: str = "lm"
    sequence_length: int = 2048
    batch_size: int = 8
    batch_tokens: int = 2**20
    total_steps: int = 1000
    lr: float = 3e-3
    min_lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 100
    decay_fraction: float = 0.1
    grad_clip: float = 1.0
    # Curriculum (implicit models): the unroll warm-up, then bounded for a share of the rest, then free.
    unroll_steps: int = 0
    unroll_depth: int = 16
    bounded_fraction: float = 0.9
    bounded_max_iter: int = 4
    bounded_phantom_steps: int = 1
    free_max_iter: int = 24
    free_phantom_steps: int = 4
    free_tol: float = 0.05
    # The contraction stage (implicit models): steps after the free phase, its solves under a Jacobian penalty.
    contraction_steps: int = 0
    contraction_jacobian: float = 0.1
    # The few-pass stage (implicit models): the last steps, after the curriculum (train/few_pass.py).
    few_pass_steps: int = 0
    few_pass_passes: int = 2
    few_pass_distance: float = 0.0
    few_pass_fixed_point: float = 1.0
    few_pass_jacobian: float = 0.0
    few_pass_logits: float = 0.0
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
    # Word problems only.
    group: str = "S3"
    hard_prob: float | None = None

    WHAT = "training option"
    FIELD_RULES = {
        "task": one_of(*TRAINING), "sequence_length": at_least(1), "batch_size": at_least(1),
        "batch_tokens": NON_NEGATIVE, "total_steps": at_least(1), "lr": POSITIVE, "min_lr": NON_NEGATIVE,
        "betas": Rule("in [0, 1)", lambda betas: all(0 <= beta < 1 for beta in betas)),
        "weight_decay": NON_NEGATIVE, "warmup_steps": NON_NEGATIVE, "decay_fraction": UNIT_INTERVAL,
        "grad_clip": POSITIVE, "unroll_steps": NON_NEGATIVE, "unroll_depth": at_least(1),
        "bounded_fraction": UNIT_INTERVAL, "bounded_max_iter": pass_count(0),
        "bounded_phantom_steps": pass_count(1), "free_max_iter": pass_count(0), "free_phantom_steps": pass_count(1), "free_tol": POSITIVE,
        "contraction_steps": NON_NEGATIVE, "contraction_jacobian": POSITIVE,
        "few_pass_steps": NON_NEGATIVE, "few_pass_passes": pass_count(1), "few_pass_distance": NON_NEGATIVE,
        "few_pass_fixed_point": NON_NEGATIVE, "few_pass_jacobian": NON_NEGATIVE, "few_pass_logits": NON_NEGATIVE,
        "precision": one_of(*PRECISIONS), "distributed": one_of(*DISTRIBUTED), "seed": SEED,
        "log_every": at_least(1), "eval_every": NON_NEGATIVE, "eval_batches": at_least(1),
        "checkpoint_every": NON_NEGATIVE, "keep_checkpoints": at_least(1), "hard_prob": UNIT_INTERVAL,
    }
    FIELD_HELP = {
        "task": "words (word problems) or lm (token shards); set by the command",
        "sequence_length": "tokens per training sequence (the paper: 2048 for LMs, 16-256 for words)",
        "batch_size": "sequences per forward on each process",
        "batch_tokens": "tokens per optimiser step over all processes and micro-batches, reached by "
                        "accumulation (the paper: 2^20); 0: one forward of batch_size sequences per process",
        "total_steps": "optimiser steps, the unroll warm-up included (raised on resume after the decay began: "
                       "the decay goes on from the rate reached)",
        "lr": "peak learning rate (AdamW)",
        "min_lr": "learning rate at the end of the decay",
        "betas": "AdamW betas",
        "weight_decay": "AdamW weight decay (weight matrices and embeddings only)",
        "warmup_steps": "steps of linear warm-up from 0 to lr",
        "decay_fraction": "share of all steps, at the end, over which the rate falls to min_lr (1 - sqrt); 0: none",
        "grad_clip": "gradient norm clipped to this",
        "unroll_steps": "implicit: steps of the differentiable unroll warm-up, first (0: none, as the paper)",
        "unroll_depth": "implicit: stack applications in each warm-up step",
        "bounded_fraction": "implicit: share of the steps after the warm-up in the bounded phase; the rest is free",
        "bounded_max_iter": "implicit: passes per bounded step's solve (the paper's 4)",
        "bounded_phantom_steps": "implicit: phantom-gradient steps per bounded step (the paper's 1)",
        "free_max_iter": "implicit: most passes per free step's solve",
        "free_phantom_steps": "implicit: phantom-gradient steps per free step",
        "free_tol": "implicit: relative residual at which a free-phase solve stops",
        "contraction_steps": "implicit: steps of the contraction stage, after the free phase (0: none): the free "
                             "phase's solves under a Jacobian penalty of contraction_jacobian, so that the map "
                             "contracts at its fixed point and no iterate cycles at inference",
        "contraction_jacobian": "implicit: contraction stage, weight of the Jacobian penalty |df/dz|_F^2 / numel",
        "few_pass_steps": "implicit: steps of the few-pass stage, the run's last, after the curriculum (0: none): it "
                          "teaches the model its fixed point's quality in few_pass_passes passes from z = 0",
        "few_pass_passes": "implicit: the passes (K) the few-pass stage trains for",
        "few_pass_distance": "implicit: few-pass stage, weight of |z_K - z*|^2 / |z*|^2, the distance of the K-pass "
                             "state to the fixed point (held without gradient)",
        "few_pass_fixed_point": "implicit: few-pass stage, weight of the fixed point's own loss (phantom gradient, the "
                                "free phase's budget), which keeps its quality",
        "few_pass_jacobian": "implicit: few-pass stage, weight of the Jacobian penalty at the fixed point (0: off)",
        "few_pass_logits": "implicit: few-pass stage, weight of KL(p* || p_K), the fixed point's next-token "
                           "distribution (held without gradient) as the K passes' soft target (0: off)",
        "precision": "auto (bf16 autocast on CUDA, full precision elsewhere), no (full precision), bf16 (autocast)",
        "distributed": "under torchrun: ddp or fsdp",
        "activation_checkpointing": "recompute each block in the backward pass (less memory, one more forward)",
        "compile": "torch.compile the stack",
        "seed": "seed of initialisation and of the data order (and of fresh training words)",
        "log_every": "steps between metrics lines",
        "eval_every": "lm: steps between held-out perplexities (0: none)",
        "eval_batches": "lm: micro-batches per held-out evaluation",
        "checkpoint_every": "steps between checkpoints (0: only at the end)",
        "keep_checkpoints": "checkpoints kept (the oldest are removed)",
        "group": "words: the group whose running products are the labels (S3, A5, S5, A5xM, D8xZ3, SL(2,3), Z60, ...)",
        "hard_prob": "words, A5xM only: probability that a token is drawn from A5 (hard) rather than Z2 (easy)",
    }

    def check(self) -> None:
        stages = (("unroll_steps", self.unroll_steps), ("contraction_steps", self.contraction_steps),
                  ("few_pass_steps", self.few_pass_steps))
        if sum(steps for _, steps in stages) > self.total_steps:
            stages = [f"{name}={steps}" for name, steps in stages if steps]
            verb = "is" if len(stages) == 1 else "are"
            raise OptionError(f"{' and '.join(stages)} {verb} more than total_steps={self.total_steps}")
        if self.min_lr > self.lr:
            raise OptionError(
                f"min_lr={self.min_lr} is more than lr={self.lr}: the decay would raise the rate, not lower it"
            )
        defaults = task_defaults(self.task)
        for name, task in OTHER_TASKS_FIELDS.items():
            if task != self.task and getattr(self, name) != defaults[name]:
                raise OptionError(f"training option '{name}' is for the {task} task, not {self.task}")

    @classmethod
    def for_task(cls, task: str, /, **values: Any) -> "TrainConfig":
        """The task's defaults, then ``values``. A key that a former trainer spelt otherwise is
        refused with its new spelling."""
        refuse_renamed_training_options(values)
        check_known_keys(values, field_names(cls), cls.WHAT)
        if values.get("task", task) != task:
            raise OptionError(f"training option 'task' is {values['task']!r}, but this command trains {task!r}")
        return cls(**{**task_defaults(task), **values})

    def tokens_per_micro_batch(self) -> int:
        return self.sequence_length * self.batch_size

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimiser step, so that one step sees ``batch_tokens`` tokens."""
        if not self.batch_tokens:
            return 1
        per_micro_step = self.tokens_per_micro_batch() * world_size
        if self.batch_tokens % per_micro_step:
            raise OptionError(
                f"batch_tokens={self.batch_tokens} is not a multiple of sequence_length x batch_size x "
                f"processes = {per_micro_step}"
            )
        return self.batch_tokens // per_micro_step

    def gradient_passes(self, implicit: bool) -> int:
        """Passes of the stack whose graph a step keeps: the unroll's depth, or the phantom steps."""
        if not implicit:
            return 1
        unroll = self.unroll_depth if self.unroll_steps else 0
        # The few-pass stage's unroll, and one more pass that reads z_K off (few_pass.py).
        few_pass = self.few_pass_passes + 1 if self.few_pass_steps else 0
        return max(unroll, self.bounded_phantom_steps, self.free_phantom_steps, few_pass)

    def curriculum(self, implicit: bool) -> Curriculum:
        if not implicit:
            for stage in ("contraction_steps", "few_pass_steps"):
                if getattr(self, stage):
                    raise OptionError(f"training option '{stage}' is for implicit models; this one is explicit")
            return Curriculum((Phase("explicit", self.total_steps),))
        after_warm_up = self.total_steps - self.unroll_steps - self.contraction_steps - self.few_pass_steps
        bounded_steps = round(self.bounded_fraction * after_warm_up)
        curriculum = Curriculum.unroll_bounded_free(
            self.unroll_steps,
            bounded_steps,
            after_warm_up - bounded_steps,
            unroll_depth=self.unroll_depth,
            bounded=(self.bounded_max_iter, self.bounded_phantom_steps),
            free=(self.free_max_iter, self.free_phantom_steps),
            free_tol=self.free_tol,
        )
        stages = [stage for stage, steps in ((self.contraction_phase(), self.contraction_steps),
                                             (self.few_pass_phase(), self.few_pass_steps)) if steps]
        return Curriculum((*curriculum.phases, *stages))

    def contraction_phase(self) -> Phase:
        """The contraction stage: the free phase's solves, and the penalty on the map's Jacobian
        at their solution that makes it contract there (a map trained without it may reach the
        task's answers by iterates that cycle, never a fixed point)."""
        return Phase("contraction", self.contraction_steps, {**self.free_solves(), "jacobian_penalty": self.contraction_jacobian})

    def few_pass_phase(self) -> Phase:
        """The few-pass stage: its fixed point solved on the free phase's budget."""
        return Phase(
            "few_pass", self.few_pass_steps, {**self.free_solves(), "jacobian_penalty": self.few_pass_jacobian},
            FewPassLoss(self.few_pass_passes, self.few_pass_distance, self.few_pass_fixed_point, self.few_pass_logits),
        )

    def free_solves(self) -> dict[str, Any]:
        """The fixed-point options of the free phase's solves, which the stages after it keep."""
        return {"unroll_steps": 0, "train_max_iter": self.free_max_iter, "phantom_steps": self.free_phantom_steps,
                "train_tol": self.free_tol}


# Fields that only one task reads (its ``Training.own_fields``); the other task refuses them.
OTHER_TASKS_FIELDS = {name: task for task, training in TRAINING.items() for name in training.own_fields}


def task_defaults(task: str) -> dict[str, Any]:
    """Every field's default for ``task``."""
    defaults = {field.name: field.default for field in dataclasses.fields(TrainConfig)}
    own = TRAINING[task].defaults if task in TRAINING else {}
    return {**defaults, **own, "task": task}
