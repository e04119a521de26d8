"""Word-problem models and training settings from a preset plus overrides.

A preset has a shared ``model`` / ``train`` section and per-kind sections
(``implicit_model``, ``explicit_train``, ...) that override it; command-line overrides
come last.
"""

from __future__ import annotations

from typing import Any

import torch

from ..data.groups import get_group
from ..models import ImplicitCausalLM, build_model, config_from_options
from .word_trainer import WordTrainConfig

KINDS = ("implicit", "explicit")


def word_train_config(preset: dict[str, Any], kind: str, overrides: dict[str, Any] | None = None) -> WordTrainConfig:
    return WordTrainConfig.from_dict({**preset.get("train", {}), **preset.get(f"{kind}_train", {}), **(overrides or {})})


def word_model(
    preset: dict[str, Any], kind: str, train: WordTrainConfig, overrides: dict[str, Any] | None = None
) -> ImplicitCausalLM:
    """A freshly initialised model (seeded by ``train.seed``) whose vocabulary is the group's elements."""
    options = {
        **preset.get("model", {}),
        **preset.get(f"{kind}_model", {}),
        **(overrides or {}),
        "implicit": kind == "implicit",
        "vocab_size": get_group(train.group).order,
        "label_alignment": "aligned",
    }
    torch.manual_seed(train.seed)
    return build_model(config_from_options(options))
