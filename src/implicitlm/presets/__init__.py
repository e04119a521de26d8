"""Presets: run presets (JSON files of options by section), the paper's model presets, and the
one rule that merges them with the command line.

- ``load_preset(name_or_path)`` / ``preset_names()``: run presets (``demo``, ``lm_wikitext2``, ...),
  a JSON file, or a checkpoint's own options; ``register_preset(name, preset)`` adds one by name.
- ``model_preset(name)`` / ``model_preset_names()``: the paper's sizes and variants
  (``mamba2-130m-bounded``), as options of ``config_from_options``.
- ``merged_options(preset, section, kind, command_line, base)``: the merge rule every command uses.
- ``model_options_from(spec)``: ``preset:NAME`` or a JSON file -> model options.
"""

from .model_presets import count_parameters, model_preset, model_preset_names, preset_summary
from .options import KINDS, merged_options, model_kind, model_options_from
from .run_presets import SECTIONS, checkpoint_preset, load_preset, preset_names, register_preset

__all__ = [
    "KINDS",
    "SECTIONS",
    "checkpoint_preset",
    "count_parameters",
    "load_preset",
    "merged_options",
    "model_kind",
    "model_options_from",
    "model_preset",
    "model_preset_names",
    "preset_names",
    "preset_summary",
    "register_preset",
]
