"""A checkpoint's model card (``README.md``): what the model is, what it was trained on, how
to load it, and how it solves; written with the checkpoint, in its staging folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_CARD = "README.md"
# The fixed-point settings a reader needs to run the model as it was trained and evaluated.
SHOWN_FIXED_POINT = ("max_iter", "tol", "passes", "solver", "chunk_length", "train_max_iter", "phantom_steps", "tau",
                     "initial_guess", "simultaneous_initial_guess", "sequential_initial_guess")


def model_card(model, meta: dict[str, Any]) -> str:
    """Markdown for the checkpoint of ``model`` whose trainer metadata is ``meta`` (its step,
    training settings and number of processes)."""
    config, train = model.config, meta.get("train", {})
    step = meta.get("step", 0)
    tokens_per_step = train.get("batch_tokens") or (
        train.get("sequence_length", 0) * train.get("batch_size", 0) * meta.get("processes", 1)
    )
    kind = "implicit (its stack iterated to a fixed point over depth)" if config.implicit else "explicit (one pass)"
    lines = [
        f"# {config.model_type}: {model.num_parameters() / 1e6:.1f}M parameters, {'implicit' if config.implicit else 'explicit'}",
        "",
        f"- family: {config.model_type} ({config.num_hidden_layers} blocks of width {config.hidden_size}, "
        f"{config.vocab_size:,} tokens)",
        f"- kind: {kind}",
        f"- parameters: {model.num_parameters():,}",
        f"- trained: {step:,} steps, {step * tokens_per_step:,} tokens ({train.get('task', 'lm')} task, "
        f"{'group ' + train['group'] + ', ' if train.get('task') == 'words' and train.get('group') else ''}"
        f"sequence length {train.get('sequence_length')})",
        *([f"- initialised from: {meta['initialised_from']}"] if meta.get("initialised_from") else []),
        *stage_lines(train),
        "",
        "## Loading",
        "",
        "```python",
        "from implicitlm.models import load_model",
        "model = load_model(\"CHECKPOINT\")",
        "",
        "import implicitlm.models  # registers the model types with transformers",
        "from transformers import AutoModelForCausalLM",
        "model = AutoModelForCausalLM.from_pretrained(\"CHECKPOINT\")",
        "```",
        "",
        "where CHECKPOINT is this folder.",
    ]
    if meta.get("measured"):
        lines += ["", "## Measured", "", *(f"- {line}" for line in meta["measured"])]
    if config.implicit:
        fixed_point = config.fixed_point
        lines += ["", "## Fixed-point settings", ""]
        lines += [f"- {name}: {fixed_point[name]}" for name in SHOWN_FIXED_POINT if fixed_point.get(name) not in (None, "")]
        lines += ["", "Change them with `model.set_fixed_point_options(max_iter=..., tol=..., passes=...)`, or on the "
                      "command line with --max-iter, --tol, --passes, --solver and --chunk-length (passes: exactly that "
                      "many passes per solve, 0: solve to tol)."]
    return "\n".join(lines) + "\n"


def stage_lines(train: dict[str, Any]) -> list[str]:
    """The contraction and few-pass stages, where the run had them."""
    lines = []
    if train.get("contraction_steps"):
        lines.append(f"- contraction stage: {train['contraction_steps']:,} steps of the free phase's solves under a "
                     f"Jacobian penalty of weight {train['contraction_jacobian']:g} at the fixed point")
    if not train.get("few_pass_steps"):
        return lines
    return lines + [f"- few-pass stage: the last {train['few_pass_steps']:,} steps trained the output after "
            f"{train['few_pass_passes']} passes from z = 0 beside the fixed point's (weight "
            f"{train['few_pass_fixed_point']:g}; distance to the fixed point {train['few_pass_distance']:g}, "
            f"Jacobian penalty {train['few_pass_jacobian']:g})"]


def write_model_card(folder: Path, model, meta: dict[str, Any]) -> None:
    (Path(folder) / MODEL_CARD).write_text(model_card(model, meta), encoding="utf-8")
