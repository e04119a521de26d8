"""Comparing, on a held-out batch, where a checkpoint's solve starts and which solver mixes
its steps (``CONFIGURATIONS``), and choosing per mode (``choose_per_mode``) the fastest
configuration among those that led no token to another fixed point than the model's own
solver from z = 0 (a map may have several, and the model's answers are those of the one z = 0
leads to; word problems are also checked on words 16 times their training length) and left no
more solves above the tolerance (``fit``'s last step before the save).
"""

from __future__ import annotations

import time

import torch

# A token's logits this far (relative) from those of the model's own solve from z = 0 went
# to another fixed point; a solve to the same one, at the tolerances in use, moves them by a
# few percent.
MOVED = 0.25
MODES = ("simultaneous", "sequential")
# (start, solver) per mode; "own" is the checkpoint's solver for the mode.
CONFIGURATIONS = (("zero", "own"), ("learned", "own"), ("zero", "learned_anderson"), ("learned", "learned_anderson"))
TIMED_RUNS = 2  # per configuration on the held-out batch; the faster is kept


def solver_name(solver: str, own: dict[str, str], mode: str) -> str:
    """A ``CONFIGURATIONS`` solver as the options name it: "own" is the checkpoint's for ``mode``."""
    return own[mode] if solver == "own" else solver


def choose_per_mode(held_out: dict[str, dict[str, dict[str, float]]],
                    use_mixing: bool = True) -> dict[str, tuple[str, str]]:
    """Per mode, the (initial_guess, solver) that ran the held-out batch fastest among those
    that led no token to another fixed point than the own solver from z = 0 (nor, for word
    problems, any token of the long words) and left no larger share of solves above the
    tolerance; without ``use_mixing`` (a fit that made it worse), those of the own solver
    only. Time, not passes: a pass of the learned mixing
    costs more than one of the least-squares step (a few dozen small operations more, which a
    token step at batch 1 notices), so fewer passes may still be slower."""
    chosen = {}
    for mode in MODES:
        measured = held_out[mode]
        baseline = measured[_name(*CONFIGURATIONS[0])]
        allowed = [configuration for configuration in CONFIGURATIONS
                   if (use_mixing or configuration[1] == "own")
                   and measured[_name(*configuration)]["moved_share"] == 0
                   and measured[_name(*configuration)].get("moved_share_long", 0) == 0
                   and measured[_name(*configuration)]["unconverged_share"] <= baseline["unconverged_share"]]
        chosen[mode] = min(allowed, key=lambda configuration: measured[_name(*configuration)]["seconds"])
    return chosen


def _name(start: str, solver: str) -> str:
    return f"{start}+{solver}"

def compare_configurations(model, own: dict[str, str], inputs: torch.Tensor,
                           longer: torch.Tensor | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode and (start, solver) of ``CONFIGURATIONS``, on the held-out batch as each mode
    serves (simultaneous: the whole batch, as scoring runs; sequential: its first sequence
    alone, as ``generate()`` decodes one): the seconds of the forward (the faster of
    ``TIMED_RUNS``), the mean passes of the map per solve (per sequence; per token) at the
    model's own inference budget, the share of solves above the tolerance, and the share of
    tokens whose logits ``MOVED`` from those of the own solver from z = 0 (another fixed
    point); with ``longer``, that share on them too (``moved_share_long``)."""
    measured: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in MODES}
    for mode in MODES:
        rows = inputs if mode == "simultaneous" else inputs[:1]
        reference, longer_reference = None, None
        for start, solver in CONFIGURATIONS:
            # Each configuration is this forward's options, the model's own left as they are.
            configuration = {f"{mode}_initial_guess": start, f"{mode}_solver": solver_name(solver, own, mode)}
            seconds = []
            for _ in range(TIMED_RUNS):
                began = time.perf_counter()
                with torch.no_grad():  # solved to the tolerance, whatever passes the checkpoint declares
                    output = model(rows, mode=mode, passes=0, fixed_point=configuration)
                seconds.append(time.perf_counter() - began)
            reference = output.logits if reference is None else reference
            measured[mode][_name(start, solver)] = {
                "seconds": round(min(seconds), 4),
                "passes": round(output.fixed_point.passes.float().mean().item(), 3),
                "unconverged_share": round((~output.fixed_point.converged).float().mean().item(), 4),
                "moved_share": _moved_share(output.logits, reference),
            }
            if longer is not None:
                with torch.no_grad():
                    logits = model(longer, mode=mode, passes=0, fixed_point=configuration).logits
                longer_reference = logits if longer_reference is None else longer_reference
                measured[mode][_name(start, solver)]["moved_share_long"] = _moved_share(logits, longer_reference)
    return measured


def _moved_share(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The share of tokens whose logits are ``MOVED`` (relative) from ``reference``'s."""
    logits, reference = logits.float(), reference.float()
    moved = (logits - reference).norm(dim=-1) > MOVED * reference.norm(dim=-1)
    return round(moved.float().mean().item(), 4)
