"""Small contractive models of every family, and a learned mixing that moves every step (an
untrained one is safeguarded Anderson exactly), for tests of the learned solver."""

from __future__ import annotations

import torch

from implicitlm.deq import LearnedMixing
from implicitlm.deq.anderson import MEMORY
from implicitlm.models import build_model, config_from_options

from tests.support.contractive import make_contractive

SMALL = {
    "mamba2": dict(architecture="mamba2", hidden_size=16, num_hidden_layers=2, state_size=8, head_dim=8, chunk_size=8),
    "llama": dict(architecture="llama", hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=24),
    "mamba": dict(architecture="mamba", hidden_size=16, num_hidden_layers=2, state_size=4, chunk_size=8),
}
TOL = 1e-5
TOKENS = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(1))


def contractive(architecture: str):
    """A 2-block model of ``architecture`` whose map contracts, solved by safeguarded Anderson to ``TOL``."""
    torch.manual_seed(0)
    options = {**SMALL[architecture], "vocab_size": 64, "fixed_point": {"max_iter": 300, "tol": TOL,
                                                                        "solver": "safeguarded_anderson"}}
    return make_contractive(build_model(config_from_options(options))).eval()


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
    """What a solver by this name needs: an active mixing for "learned_anderson", else none."""
    return active_mixing() if solver == "learned_anderson" else None
