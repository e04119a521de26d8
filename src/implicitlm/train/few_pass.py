"""The few-pass stage: the last steps of a run teach an implicit model to reach its fixed
point's quality in K passes of the stack from z = 0, while keeping the fixed point.

Each micro-step runs two forwards, each followed by its own backward (so a data-parallel
model sees one forward per backward):
- at the fixed point, as the free phase does (no-grad solve, phantom gradient): its
  cross-entropy, weighted ``fixed_point``, keeps the fixed point's quality, and the fixed
  point itself, without gradient, is the teacher of the second forward (C-DEQ,
  arXiv 2602.03024). The phase's ``jacobian_penalty``, if any, is added here, at the solution;
- K passes from z = 0, differentiated through (the unroll): their cross-entropy, plus
  ``distance`` times the mean over samples of ``|z_K - z*|^2 / |z*|^2``, plus ``logits`` times
  the mean over tokens of KL(p* || p_K), the fixed point's next-token distribution as the
  K passes' soft target (distillation from the model's own deeper computation).
Where neither the fixed point's loss nor a Jacobian penalty is asked for, the first forward
runs without gradient, and where no teacher term is asked for either, not at all. Both
teacher terms are off by default: on WikiText-2's validation text the distance cost the
fixed point more than it gave the K passes (the warm-start guide has the figures).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from ..deq import penalised
from ..models.loss import token_cross_entropy


@dataclass(frozen=True)
class FewPassLoss:
    """The stage's loss: ``passes`` (K) and the weights of its terms besides the K-pass
    cross-entropy."""

    passes: int
    distance: float
    fixed_point: float
    logits: float = 0.0

    @property
    def taught(self) -> bool:
        """Whether a term needs the fixed point as the K passes' teacher."""
        return bool(self.distance or self.logits)


def few_pass_micro_step(accelerator, model, input_ids, labels, loss: FewPassLoss, scale: float, sync: bool,
                        fixed_point: dict[str, Any] | None = None):
    """Both forwards and backwards of one micro-batch, each backward's loss times ``scale``
    (1 / the accumulation steps), each forward given ``fixed_point`` (the stage's options);
    gradients are synchronised between processes after the second one if ``sync``. Returns the
    K-pass cross-entropy (the step's loss), the other terms computed (``fixed_point_loss``,
    ``distance``, ``distillation``), detached, and the K-pass output."""
    core = accelerator.unwrap_model(model)
    teacher, fixed_point_loss = None, None
    jacobian = core.fixed_point_options(fixed_point).jacobian_penalty > 0
    if loss.fixed_point or jacobian:
        with accelerator.no_sync(model):
            output = model(input_ids, output_hidden_states=bool(loss.distance), fixed_point=fixed_point)
            fixed_point_loss = token_cross_entropy(output.logits, labels, "aligned")
            accelerator.backward(penalised(loss.fixed_point * fixed_point_loss, output.fixed_point) * scale)
        teacher = output if loss.taught else None
        fixed_point_loss = fixed_point_loss.detach()
    elif loss.taught:
        with torch.no_grad():
            teacher = model(input_ids, output_hidden_states=bool(loss.distance), fixed_point=fixed_point)
    with contextlib.nullcontext() if sync else accelerator.no_sync(model):
        # K passes from z = 0 with autograd (the unroll), without the phase's Jacobian penalty,
        # which belongs at the fixed point. The hidden states' one more pass over z_K is what
        # gives z_K itself: the head reads it.
        output = model(input_ids, passes=loss.passes, output_hidden_states=bool(loss.distance), fixed_point=fixed_point)
        cross_entropy = token_cross_entropy(output.logits, labels, "aligned")
        terms = {"fixed_point_loss": fixed_point_loss}
        if loss.distance:
            terms["distance"] = relative_distance(output.hidden_states[-1], teacher.hidden_states[-1].detach())
        if loss.logits:
            terms["distillation"] = distillation(output.logits, teacher.logits.detach())
        weights = {"distance": loss.distance, "distillation": loss.logits}
        objective = cross_entropy + sum(weights[name] * terms[name] for name in weights if name in terms)
        accelerator.backward(objective * scale)
    return cross_entropy.detach(), {name: value.detach() for name, value in terms.items() if value is not None}, output


def distillation(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """The mean over tokens of KL(target || logits' distribution), in full precision."""
    log_p = torch.log_softmax(logits.float().flatten(0, -2), dim=-1)
    log_target = torch.log_softmax(target_logits.float().flatten(0, -2), dim=-1)
    return torch.nn.functional.kl_div(log_p, log_target, log_target=True, reduction="batchmean")


def relative_distance(z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean over samples of ``|z - target|^2 / |target|^2``: each sample's distance at the
    scale of its own fixed point."""
    squares = lambda x: x.float().pow(2).flatten(1).sum(dim=1)
    return (squares(z - target) / squares(target).clamp_min(1e-12)).mean()

