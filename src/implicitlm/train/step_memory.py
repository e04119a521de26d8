"""A training step's memory, estimated from the model's config and the training settings
before the model, its optimiser or its batches exist: a run that does not fit is refused in
one line, where it would otherwise be killed by the kernel without a word."""

from __future__ import annotations

from typing import Callable

from ..core.memory import available_bytes, readable, require, training_step_bytes
from ..models.loading import parameter_count
from .config import TrainConfig
from .speed import training_device


def training_memory(model_config, config: TrainConfig) -> int:
    """``core.memory.training_step_bytes`` for the model ``model_config`` describes (its
    parameters counted on the meta device) trained with ``config``."""
    return training_step_bytes(
        parameter_count(model_config), config.batch_size, config.sequence_length, model_config.hidden_size,
        model_config.num_hidden_layers, model_config.vocab_size, config.gradient_passes(model_config.implicit),
    )


def require_training(
    model_config, config: TrainConfig, smaller: Callable[[int], str] | None = None, device: str | None = None,
) -> None:
    """Refuse, in one line with the estimate and the memory available, a training step that
    does not fit on ``device`` (``speed.training_device``). ``smaller(available)``: what would
    fit instead, for the message."""
    needed, device = training_memory(model_config, config), training_device(device)
    hint = smaller(available_bytes(device)) if smaller is not None and needed > available_bytes(device) else ""
    graphs = config.gradient_passes(model_config.implicit)
    require(
        f"training a model of {parameter_count(model_config):,} parameters at {config.batch_size} x "
        f"{config.sequence_length} tokens per batch ({graphs} pass(es) kept for the gradient)",
        needed, device, about=True, hint=hint, arguments=("preset",) if hint else (),
    )


def fitting_preset(estimates: dict[str, Callable[[], int]], available: int) -> str:
    """A message's suggestion: the first preset of ``estimates`` (name: its step's memory,
    largest model first) that fits in ``available``, else the last."""
    needed: dict[str, int] = {}
    for name, estimate in estimates.items():
        needed[name] = estimate()
        if needed[name] <= available:
            break
    name = list(needed)[-1]
    return f"; a smaller model: preset={name} (about {readable(needed[name])})"
