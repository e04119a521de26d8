"""Token-level cross-entropy for shifted (next-token) and aligned (word-problem) labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.errors import OptionError

IGNORE_INDEX = -100


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, alignment: str, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Mean cross-entropy over labelled positions.

    ``num_items_in_batch``: the labelled positions of a whole accumulated batch (as
    transformers' Trainer passes it); the sum over this micro-batch is divided by it, so
    micro-batches of unequal label counts weigh each label equally.

    ``alignment="shifted"``: position t predicts label t + 1 (causal LM, labels = input_ids).
    ``alignment="aligned"``: position t predicts label t; shifting these, as a causal-LM
    loss would, trains the model to predict the *next* running product instead.
    """
    if alignment == "shifted":
        logits, labels = logits[:, :-1], labels[:, 1:]
    elif alignment != "aligned":
        raise OptionError(f"unknown label alignment {alignment!r}")
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction
    )
    return loss if num_items_in_batch is None else loss / num_items_in_batch
