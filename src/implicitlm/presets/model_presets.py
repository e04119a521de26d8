"""The paper's models as presets: one JSON file per model size, three training variants each.

A size file (``implicitlm/presets/models/<stem>.json``) holds, under "model", the options
of ``config_from_options`` that fix the architecture, and under "free_passes" the training
passes of its free variant (the paper's: 24 for Mamba2, 32 for Llama; a size file says its
own, so that a family needs no entry here; one that spells it "free_iterations", as size files
once did, reads the same: ``core/migrations.py``). A variant adds the fixed-point budget:

- ``explicit``: one pass through the stack, no fixed point;
- ``bounded``, "(4+1)": 4 passes without gradient, then 1 phantom step;
- ``free``, "(24+4)" for Mamba2 and "(32+4)" for Llama: up to "free_passes" passes,
  stopped once the relative residual is under 0.05, then 4 phantom steps.

Both implicit variants use tau = 0.8 and evaluate with 4 times their training passes
(the authors' eval_factor). A size file may list its own "variants", each with the
fixed-point options that differ from these defaults; it then has only those variants.

Preset names are "<stem>-<variant>", e.g. "mamba2-130m-bounded". A size file also records
its models' "parameters" (``count_parameters``, by kind: "explicit", "implicit"), which
``implicitlm models list`` shows without building a model (or importing torch); a test
checks them against the models built.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources
from typing import Any

from ..core.errors import OptionError
from ..core.migrations import model_size_file

VARIANTS = ("explicit", "bounded", "free")
FREE_TOL = 0.05
TAU = 0.8
EVAL_FACTOR = 4


def model_preset_names() -> list[str]:
    return [f"{stem}-{variant}" for stem, size in _size_files().items() for variant in _variants(size)]


def model_preset(name: str) -> dict[str, Any]:
    """The options of a preset, ready for ``config_from_options``."""
    stem, variant = _split(name)
    size = _size_files()[stem]
    fixed_point = variant_fixed_point(variant, size["free_passes"]) | _variants(size)[variant]
    return {**size["model"], "implicit": variant != "explicit", "fixed_point": fixed_point}


def variant_fixed_point(variant: str, free_passes: int) -> dict[str, Any]:
    """The fixed-point options of a variant before a size file's own changes; ``free_passes``:
    the size file's training passes of the free variant."""
    if variant == "explicit":
        return {}
    if variant == "bounded":
        # The paper names no stopping tolerance for the bounded phase: the package default
        # (1e-3) stays, and stopping there changes z* by about that much.
        return _budget(passes=4, phantom_steps=1)
    free = _budget(passes=free_passes, phantom_steps=4)
    return free | {"train_tol": FREE_TOL, "tol": FREE_TOL}


def preset_summary(name: str) -> dict[str, Any]:
    """What ``implicitlm models list`` shows of a preset."""
    options, variant = model_preset(name), _split(name)[1]
    fixed_point = options["fixed_point"]
    implicit = options["implicit"]
    return {
        "name": name,
        "architecture": options["architecture"],
        "layers": options["num_hidden_layers"],
        "d_model": options["hidden_size"],
        "variant": f"{variant} ({fixed_point['train_max_iter']}+{fixed_point['phantom_steps']})" if implicit else variant,
        "eval_max_iter": fixed_point["max_iter"] if implicit else None,
        "parameters": _size_files()[_split(name)[0]]["parameters"][kind_of(implicit)],
    }


def kind_of(implicit: bool) -> str:
    """The key of a size file's "parameters" for a variant: its counts by kind of model."""
    return "implicit" if implicit else "explicit"


def count_parameters(name: str) -> int:
    """Parameters of the preset's model, weight-norm scales and injection included.

    The model is built on the meta device: shapes without storage, so a 1.3B model
    is counted without allocating its weights.
    """
    # Here, not at the top: the command line checks a preset's name before it loads torch.
    import torch

    from ..models.loading import build_model, config_from_options

    with torch.device("meta"):
        model = build_model(config_from_options(model_preset(name)))
    return sum(p.numel() for p in model.parameters())


def _budget(passes: int, phantom_steps: int) -> dict[str, Any]:
    return {
        "train_max_iter": passes,
        "phantom_steps": phantom_steps,
        "tau": TAU,
        "stop_mode": "rel",
        "max_iter": EVAL_FACTOR * passes,
    }


def _variants(size: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Variant name -> the size file's changes to its fixed-point options."""
    return size.get("variants", {variant: {} for variant in VARIANTS})


def _split(name: str) -> tuple[str, str]:
    stem, _, variant = name.rpartition("-")
    if stem in _size_files() and variant in _variants(_size_files()[stem]):
        return stem, variant
    close = difflib.get_close_matches(name, model_preset_names(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see `implicitlm models list`"
    raise OptionError(f"unknown model preset '{name}' ({hint})")


@cache
def _size_files() -> dict[str, dict[str, Any]]:
    """Stem -> size file, by family, then smallest first."""
    folder = resources.files("implicitlm.presets").joinpath("models")
    files = [p for p in folder.iterdir() if p.name.endswith(".json")]
    sizes = {p.name.removesuffix(".json"): model_size_file(json.loads(p.read_text())) for p in files}
    return dict(sorted(sizes.items(), key=lambda item: _size_key(item[1]["model"])))


def _size_key(model: dict[str, Any]) -> tuple[str, int, int]:
    return model["architecture"], model["hidden_size"], model["num_hidden_layers"]
