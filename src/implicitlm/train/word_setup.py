"""Word-problem models and training settings from a preset plus overrides, merged by the
presets' one rule (shared section, then the kind's, then the command line)."""

from __future__ import annotations

from typing import Any

import torch

from ..data.groups import get_group
from ..models import ImplicitCausalLM, build_model, config_from_options
from ..presets import merged_options
from .word_trainer import WordTrainConfig


def word_train_config(preset: dict[str, Any], kind: str, overrides: dict[str, Any] | None = None) -> WordTrainConfig:
    return WordTrainConfig.from_dict(merged_options(preset, "train", kind, overrides or {}))


def word_model(
    preset: dict[str, Any], kind: str, train: WordTrainConfig, overrides: dict[str, Any] | None = None
) -> ImplicitCausalLM:
    """A freshly initialised model (seeded by ``train.seed``) whose vocabulary is the group's elements."""
    options = {
        **merged_options(preset, "model", kind, overrides or {}),
        "implicit": kind == "implicit",
        "vocab_size": get_group(train.group).order,
        "label_alignment": "aligned",
    }
    torch.manual_seed(train.seed)
    return build_model(config_from_options(options))
