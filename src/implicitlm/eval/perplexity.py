"""Held-out loss and perplexity of a causal language model on token windows."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from ..models.loss import token_cross_entropy


@torch.no_grad()
def perplexity(
    model,
    windows: Iterable[torch.Tensor],
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
) -> dict[str, float]:
    """Token-weighted mean loss and its exponential over ``windows`` ((b, L + 1) token
    batches: inputs are the first L tokens, each predicts the next), in evaluation mode
    with the evaluation budget unless ``max_iter`` / ``tol`` say otherwise."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens = 0.0, 0
    try:
        for window in windows:
            window = window.to(model.device)
            logits = model(window[:, :-1], mode=mode, max_iter=max_iter, tol=tol).logits
            targets = window[:, 1:]
            total_loss += token_cross_entropy(logits, targets, "aligned").item() * targets.numel()
            total_tokens += targets.numel()
    finally:
        model.train(was_training)
    if total_tokens == 0:
        raise ValueError("no held-out tokens to evaluate")
    loss = total_loss / total_tokens
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": total_tokens}
