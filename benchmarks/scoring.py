"""Scoring continuations (lm-eval's loglikelihood requests): the logits and log-softmax of
the continuation's positions only (``logits_to_keep``) against those of every position.

Shapes are HellaSwag's with the WikiText-2 model of the README (d_model 272, 4 layers):
a batch of 32 left-padded texts of 96 tokens whose last 24 are scored. The head over the
vocabulary costs as much as the blocks of so small a model, so the saving grows with the
vocabulary (4,096 for the WikiText-2 tokenizer, 50,277 for GPT-NeoX's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import Table, paired_median_seconds, synchronize

from implicitlm.models import build_model, config_from_options

BATCH, LENGTH, SCORED = 32, 96, 24


def build(vocab_size: int, implicit: bool, device: str):
    torch.manual_seed(0)
    options = dict(architecture="mamba2", implicit=implicit, vocab_size=vocab_size, hidden_size=272,
                   num_hidden_layers=4, state_size=64, head_dim=34)
    return build_model(config_from_options(options)).to(device).eval()


@torch.no_grad()
def score(model, ids: torch.Tensor, kept: int) -> torch.Tensor:
    """Log-probabilities of the last ``SCORED`` tokens, from ``kept`` positions of logits (0: all)."""
    logits = model(ids, max_iter=4, tol=1e-12, logits_to_keep=kept).logits
    logprobs = F.log_softmax(logits.float(), dim=-1)[:, -SCORED:]
    synchronize(ids.device)
    return logprobs.gather(-1, ids[:, -SCORED:, None])


def run(quick: bool, device: str = "cpu") -> Table:
    repeats = 3 if quick else 7
    table = Table(
        f"Scoring {SCORED} of {LENGTH} tokens, batch {BATCH}, d_model 272, 4 layers, {device}",
        ["model", "vocabulary", "all logits ms", f"last {SCORED} ms", "speed-up"],
    )
    for vocab_size in (4096, 50277):
        for implicit in (False, True):
            model = build(vocab_size, implicit, device)
            ids = torch.randint(0, vocab_size, (BATCH, LENGTH), device=device)
            # The same log-probabilities either way, before anything is timed.
            torch.testing.assert_close(score(model, ids, SCORED), score(model, ids, 0))
            timed = paired_median_seconds(lambda: score(model, ids, 0), lambda: score(model, ids, SCORED), repeats)
            kind = "implicit (4 passes)" if implicit else "explicit"
            table.add(kind, f"{vocab_size:,}", f"{timed.baseline * 1e3:.1f}", f"{timed.candidate * 1e3:.1f}",
                      f"{1 / timed.ratio:.2f}x")
    table.notes.append(f"medians of {repeats} paired runs; speed-up = all logits / last {SCORED}, per pair")
    return table
