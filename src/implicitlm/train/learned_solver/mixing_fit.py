"""Fitting a learned mixing of safeguarded Anderson's steps (``models.learned_solver.LearnedMixing``,
the solver "learned_anderson") to a frozen model's maps, one batch at a time (``fit``).

The mixing runs ``MIXING_PASSES`` steps of learned Anderson on the batch's simultaneous map
and on a few of its tokens' sequential maps (from z = 0 on even batches, from the guess on
odd ones) and gets one update on the mean over those steps of the log relative residual
|f(x) - x| / |f(x)| at each iterate x it proposed: what the stop test reads (the paper's
per-step loss, the distance to z*, is ``mixing_loss="distance"``: tried here, it cut that
distance and cost passes). Each step's residual loss reads that step's mixing through one
pass of the map, which the solve's next evaluation reuses; the iterate is handed on detached.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...deq.solvers.anderson import safeguarded_anderson
from ...models.learned_solver import InitialGuess, LearnedMixing
from .guess_fit import decay, relative_distance
from .progress import FitState

LOGGER = logging.getLogger("implicitlm")

# Steps of learned Anderson per batch for the mixing's update: about as many as a solve to
# the inference tolerances in use takes.
MIXING_PASSES = 10
# Sequences of each batch whose simultaneous solve the mixing learns from (a step there costs
# a pass over the whole sequence and its backward), and tokens per batch whose sequential-mode
# solves it also learns from (a step there, one token's).
MIXING_SEQUENCES = 1
TOKEN_POSITIONS = 4
# What each learned step is fitted to minimise: "residual", the log relative residual
# |f(x) - x| / |f(x)| at the iterate x it proposed (what the stop test reads); "distance", the
# paper's, |x - z*| / |z*| (on the WikiText-2 model it cut that distance and cost passes:
# 9.88 per held-out sequence against 8.94).
MIXING_LOSSES = ("residual", "distance")


def fit_mixing(model, mixing: LearnedMixing, optimizer, inputs: torch.Tensor, z_star: torch.Tensor,
               guess: InitialGuess | None, state: FitState, settings: dict[str, Any]) -> None:
    """One update of the mixing on learned-Anderson runs of ``MIXING_PASSES`` steps, in both
    modes' maps: ``MIXING_SEQUENCES`` whole sequences', and ``TOKEN_POSITIONS`` tokens' maps (each from the
    state its predecessors' fixed points left), from ``guess`` or (None) from z = 0. Each
    step's loss is back-propagated as it comes (the next step reads the iterate detached).
    ``z_star``: the batch's fixed points, which the token maps' states are read off."""
    update = len(state.losses["mixing"])
    decay(optimizer, settings["lr"], update, settings["steps"])
    optimizer.zero_grad(set_to_none=True)
    draw = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + update)
    positions = sorted(torch.randperm(inputs.shape[1], generator=draw)[:TOKEN_POSITIONS].tolist())
    runs = 1 + len(positions)
    per_step = []

    def fit_run(f, start: torch.Tensor, target: torch.Tensor) -> None:
        reused = _ReusedEvaluation(f)

        def step_loss(proposed: torch.Tensor) -> None:
            if settings["mixing_loss"] == "distance":
                loss = relative_distance(proposed.flatten(1), target.flatten(1)).mean()
            else:
                loss = reused.relative_residual(proposed).clamp_min(1e-8).log().mean()
            (loss / (MIXING_PASSES * runs)).backward()
            per_step.append(loss.item())

        safeguarded_anderson(reused, start, MIXING_PASSES, mixing=mixing, on_proposed=step_loss)

    with model.fixed_point_map(inputs[:MIXING_SEQUENCES]) as (embedded, f):
        fit_run(f, torch.zeros_like(embedded) if guess is None else guess(embedded).detach(),
                z_star[:MIXING_SEQUENCES])
    with model.token_maps(inputs, z_star, positions) as maps:
        for t, (embedded_t, f_t, read_t) in zip(positions, maps):
            previous = z_star[:, t - 1] if t > 0 else None
            start = torch.zeros_like(z_star[:, t]) if guess is None else guess(embedded_t, previous, read_t).detach()
            fit_run(f_t, start, z_star[:, t])
    optimizer.step()
    state.losses["mixing"].append(sum(per_step) / len(per_step))


class _ReusedEvaluation:
    """The map as the solver sees it during a fit, where each learned step's loss evaluates
    the map at the step's iterate with autograd on (the relative residual there, in the
    iterate's gradient): the solver's next evaluation, at that iterate detached, is the one
    the loss made, not a second pass."""

    def __init__(self, f) -> None:
        self.f, self.kept = f, None

    def relative_residual(self, iterate: torch.Tensor) -> torch.Tensor:
        """Each sample's |f(x) - x| / |f(x)| at ``iterate``, with the graph through f."""
        with torch.enable_grad():
            image = self.f(iterate)
        self.kept = (iterate.detach(), image.detach())
        step = (image - iterate).float().flatten(1).norm(dim=1)
        return step / (image.float().flatten(1).norm(dim=1) + 1e-9)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.kept is not None and torch.equal(z, self.kept[0]):
            return self.kept[1]
        return self.f(z)


def mixing_improved(loss: dict[str, float], mixing_loss: str) -> bool:
    """Whether the mixing's fit lowered its loss (``loss``: its first update's and the mean of
    its last ones, as the record keeps them). A fit that raised it is said in a warning line,
    and its mixing, saved all the same, is chosen for no mode (``comparison.choose_per_mode``)."""
    if loss["last"] <= loss["first"]:
        return True
    LOGGER.warning(f"learned mixing: its fit raised the mean {mixing_loss} loss over its steps ({loss['first']:.2f} -> "
                   f"{loss['last']:.2f}); saved, but not used (solver learned_anderson still picks it)")
    return False
