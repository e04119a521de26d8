"""Small contractive models of every family, and a learned mixing that moves every step (an
untrained one is safeguarded Anderson exactly), for tests of the learned solver."""

from __future__ import annotations

import torch

from implicitlm.deq.solvers import needs_mixing
from implicitlm.deq.solvers.anderson import MEMORY
from implicitlm.models.learned_solver import LearnedMixing

from tests.support.models import SMALL, contractive_model, token_ids

TOL = 1e-5
TOKENS = token_ids(3, 12, seed=1, vocab=64)


def contractive(architecture: str):
    """A 2-block model of ``architecture`` whose map contracts, solved by safeguarded Anderson to ``TOL``."""
    fixed_point = {"max_iter": 300, "tol": TOL, "solver": "safeguarded_anderson"}
    return contractive_model(dtype=torch.float32, **SMALL[architecture], vocab_size=64, fixed_point=fixed_point)


def run(model, mode: str):
    """(logits, fixed-point stats) of ``model`` on ``TOKENS`` in ``mode``."""
    with torch.no_grad():
        output = model(TOKENS, mode=mode)
    return output.logits, output.fixed_point


def active_mixing(seed: int = 0, scale: float = 0.3) -> LearnedMixing:
    """Random weights, the last layer's too: each step's weights and damping differ from the
    least-squares step by a few tenths."""
    generator = torch.Generator().manual_seed(seed)
    mixing = LearnedMixing(MEMORY)
    with torch.no_grad():
        for parameter in mixing.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return mixing.eval().requires_grad_(False)


def mixing_for(solver: str) -> LearnedMixing | None:
    """What a solver by this name needs: an active mixing for one that mixes by it, else none."""
    return active_mixing() if needs_mixing(solver) else None
