"""Training runs as the command line starts them: settings and a fresh model from a preset
plus overrides, merged by the presets' one rule (shared section, then the kind's, then the
command line), or a run's own settings and latest weights to resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.run_folder import latest_checkpoint
from ..data.groups import get_group
from ..data.shards import TokenShards
from ..data.word_storage import load_words
from ..models import ImplicitCausalLM, build_model, config_from_options, load_model
from ..presets import load_preset, merged_options, model_kind, model_options_from
from .config import TrainConfig
from .trainer import resume_config, train


def word_train_config(preset: dict[str, Any], kind: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    return TrainConfig.for_task("words", **merged_options(preset, "train", kind, overrides or {}))


def word_model(
    preset: dict[str, Any], kind: str, config: TrainConfig, overrides: dict[str, Any] | None = None
) -> ImplicitCausalLM:
    """A freshly initialised model (seeded by ``config.seed``) whose vocabulary is the group's elements."""
    options = {
        **merged_options(preset, "model", kind, overrides or {}),
        "implicit": kind == "implicit",
        "vocab_size": get_group(config.group).order,
        "label_alignment": "aligned",
    }
    torch.manual_seed(config.seed)
    return build_model(config_from_options(options))


def train_words_run(
    out_dir: Path, preset: str | None = None, explicit: bool = False, data: Path | None = None,
    model_options: dict[str, Any] | None = None, train_options: dict[str, Any] | None = None,
    resume: bool = False, overwrite: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """``implicitlm words train``: a fresh run from a preset (``explicit``: the explicit
    model), or, with ``resume``, the run in ``out_dir`` continued with its own model and
    settings (``train_options`` on top). ``data``: a word file; None trains on fresh words."""
    if resume and (preset or model_options or explicit):
        raise ValueError("--resume continues the run with its own model; only --train options may change")
    presets = load_preset(preset) if preset else {}
    kind = "explicit" if explicit else "implicit"
    config = resume_config(out_dir, train_options or {}) if resume else word_train_config(presets, kind, train_options)
    words = load_words(data, group=config.group) if data else None
    if words is not None and words.group != get_group(config.group).name:
        raise ValueError(f"{data}: words over {words.group}, but the training group is {config.group}")
    model = load_model(latest_checkpoint(out_dir)) if resume else word_model(presets, kind, config, model_options)
    return train(model, config, out_dir, data=words, resume=resume, overwrite=overwrite, progress=progress)


def train_lm_run(
    data: Path, out_dir: Path, preset: str | None = None, model_preset: str | None = None,
    model_options: dict[str, Any] | None = None, train_options: dict[str, Any] | None = None,
    resume: bool = False, overwrite: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """``implicitlm train``: a language model on the token shards in ``data``, from a run
    preset and a model preset (name or JSON), or, with ``resume``, the run in ``out_dir``
    continued with its own settings (``train_options`` on top)."""
    if resume:
        config = resume_config(out_dir, train_options or {})
        model = load_model(latest_checkpoint(out_dir))
        return train(model, config, out_dir, data=data, resume=True, progress=progress)
    presets = load_preset(preset) if preset else {}
    command_line = dict(model_options or {})
    base = model_options_from(model_preset) if model_preset else {}
    # A preset's "explicit_model" / "implicit_model" section holds the widths that give both
    # kinds the same number of parameters; the command line still has the last word.
    kind = model_kind(presets, command_line, base)
    config = TrainConfig.for_task("lm", **merged_options(presets, "train", kind, train_options or {}))
    # The vocabulary is the shards' tokenizer's, unless an option says otherwise.
    base["vocab_size"] = TokenShards(data, "train").vocab_size
    options = {"label_alignment": "shifted", **merged_options(presets, "model", kind, command_line, base)}
    torch.manual_seed(config.seed)  # the initial weights are part of the run's seed
    model = build_model(config_from_options(options))
    return train(model, config, out_dir, data=data, overwrite=overwrite, progress=progress)
