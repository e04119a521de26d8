"""A checkpoint's model card (``README.md``): what the model is, every stage of its training,
how to load it, what was measured of it, and how the loaded model solves; written with the
checkpoint, in its staging folder.

A card says only what checked values say: the metadata as ``read_trainer_meta`` holds it
(one printable line per string), each stage's training settings as ``TrainConfig`` takes them,
the solves as the model's own options run them. A record's string is shown as text of a list
item, never as markdown of the card's own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..core import migrations
from ..core.run_folder import STAGE_KEYS
from ..deq.options import FixedPointOptions
from ..models.families import BY_MODEL_TYPE
from .config import OTHER_TASKS_FIELDS, TrainConfig

MODEL_CARD = "README.md"
# What a solve of each inference mode is, in a reader's words.
SOLVES = {"simultaneous": "a sequence at once (simultaneous mode: scoring and evaluation)",
          "sequential": "token by token (sequential mode: generation)"}
# A task's own settings a stage's line shows, where its task takes them: the group whose words it learnt.
TASK_SETTINGS_SHOWN = ("group",)
# Where a line of a record would open a block of markdown (a heading, quote, list, rule or
# fence) rather than continue the list item it is shown in: escaped there.
BLOCK_START = re.compile(r"^(?:\d+(?=[.)])|(?=[#>*+_~-])|(?=```))")
LOADING = [
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


def model_card(model, meta: dict[str, Any]) -> str:
    """Markdown for the checkpoint of ``model`` whose trainer metadata is ``meta`` (as
    ``read_trainer_meta`` returns it: its step, training settings, processes, origin, the
    stages before it and what was measured of it)."""
    config = model.config
    kind = "implicit" if config.implicit else "explicit"
    lines = [f"# {BY_MODEL_TYPE[config.model_type].architecture}, {kind}: {compact(model.num_parameters())} parameters",
             "", *description(model), "", "## Training", "", *training(meta, config.implicit), "", *LOADING]
    if meta.get("measured"):
        lines += ["", "## Measured", "", *(f"- {inline(line)}" for line in meta["measured"])]
    if config.implicit:
        lines += ["", "## How it solves", "", *solving(model)]
    return "\n".join(lines) + "\n"


def description(model) -> list[str]:
    config = model.config
    blocks = config.num_hidden_layers
    kind = ("implicit: its stack iterated to a fixed point over depth" if config.implicit
            else "explicit: one pass of its stack")
    return [
        f"- architecture: {BY_MODEL_TYPE[config.model_type].architecture}, {blocks} block{'s' * (blocks != 1)} of "
        f"width {config.hidden_size}, a vocabulary of {config.vocab_size:,} tokens",
        f"- kind: {kind}",
        f"- parameters: {model.num_parameters():,}",
        f"- transformers model type: {config.model_type} (either kind)",
    ]


def compact(count: int) -> str:
    """A parameter count in three figures or so: 1.78M, 48.2k."""
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    return f"{count / 1e3:.1f}k" if count >= 1_000 else str(count)


def inline(text: str) -> str:
    """A record's string (one printable line) as text of a list item: no block of its own,
    no HTML."""
    return BLOCK_START.sub(lambda start: start.group(0) + "\\", text.strip().replace("<", "&lt;"), count=1)


def training(meta: dict[str, Any], implicit: bool) -> list[str]:
    """Every stage the model went through, oldest first, this checkpoint's last, and their sum."""
    own = {key: meta[key] for key in STAGE_KEYS if key in meta}
    recorded = "step" in own
    stages = [*meta.get("lineage", []), *([{**own, "implicit": implicit}] if recorded else [])]
    if not stages:
        return ["No training recorded (a model imported or built, not trained here)."]
    lines = []
    for number, stage in enumerate(stages, 1):
        lines += stage_lines(number, stage, last=recorded and number == len(stages))
    if len(stages) > 1:
        totals = [stage_extent(stage) for stage in stages]
        if all(extent is not None for extent in totals):
            lines += ["", f"In all: {sum(stage['step'] for stage in stages):,} steps, "
                          f"{sum(tokens for _, tokens in totals):,} tokens."]
    return lines


def stage_lines(number: int, stage: dict[str, Any], last: bool) -> list[str]:
    """One stage: its kind, where it began, its steps and tokens; its special stages below."""
    origin = stage.get("initialised_from")
    began = (f"from stage {number - 1}" + (f" ({inline(origin)})" if origin else "") if number > 1
             else f"initialised from {inline(origin)}" if origin else "from scratch")
    head = f"{number}. {'implicit' if stage['implicit'] else 'explicit'}, {began}: {stage['step']:,} steps"
    this = "; this checkpoint" * last
    extent = stage_extent(stage)
    if extent is None:
        return [f"{head} (training settings not recorded){this}"]
    settings, (length, tokens) = stage_settings(stage), extent
    own = "".join(f"{name} {inline(str(getattr(settings, name)))}, " for name in TASK_SETTINGS_SHOWN
                  if OTHER_TASKS_FIELDS[name] == settings.task)
    return [f"{head}, {tokens:,} tokens ({settings.task} task, {own}sequence length {length}){this}",
            *(f"   - {line}" for line in special_stages(settings))]


def stage_settings(stage: dict[str, Any]) -> TrainConfig:
    """A stage's training settings, a former trainer's read as today's."""
    train = migrations.training_settings(stage["train"], "the training settings")
    return TrainConfig.for_task(train["task"], **train)


def stage_extent(stage: dict[str, Any]) -> tuple[int, int] | None:
    """The sequence length a stage trained at and the tokens it trained on (None: its settings
    unrecorded): each step's ``batch_tokens``, else every process's batch of sequences."""
    if "train" not in stage:
        return None
    settings = stage_settings(stage)
    per_step = settings.batch_tokens or settings.sequence_length * settings.batch_size * stage.get("processes", 1)
    return settings.sequence_length, stage["step"] * per_step


def special_stages(settings: TrainConfig) -> list[str]:
    """The contraction and few-pass stages, where the run had them."""
    lines = []
    if settings.contraction_steps:
        lines.append(f"contraction stage: {settings.contraction_steps:,} steps of the free phase's solves under a "
                     f"Jacobian penalty of weight {settings.contraction_jacobian:g} at the fixed point")
    if settings.few_pass_steps:
        distilled = f"distillation of its logits {settings.few_pass_logits:g}, " if settings.few_pass_logits else ""
        lines.append(f"few-pass stage: the last {settings.few_pass_steps:,} steps trained the output after "
                     f"{settings.few_pass_passes} passes from z = 0 beside the fixed point's (weight "
                     f"{settings.few_pass_fixed_point:g}; distance to the fixed point {settings.few_pass_distance:g}, "
                     f"{distilled}Jacobian penalty {settings.few_pass_jacobian:g})")
    return lines


def solving(model) -> list[str]:
    """Each inference mode's solve as the loaded model runs it, and the learned solver it carries."""
    options: FixedPointOptions = model.solver.options
    lines = ["As loaded, each solve of the stack's fixed point:", ""]
    lines += [f"- {what}: {solve(options, mode)}" for mode, what in SOLVES.items()]
    if model.learned_guess is not None or model.learned_mixing is not None:
        # A budget of passes iterates plainly: the mixing serves only solves to the tolerance.
        to_tol = " with `--passes 0` (a solve to the tolerance)" * bool(options.passes)
        lines += ["", "It carries a learned solver (`implicitlm solver train`: an initial guess and a mixing of "
                      "Anderson's steps): `--initial-guess learned` starts each solve from its guess, "
                      f"`--solver learned_anderson` mixes its steps{to_tol}."]
    return lines + ["", "Change them with `model.set_fixed_point_options(max_iter=..., tol=..., passes=...)`, or on "
                        "the command line with --max-iter, --tol, --passes, --solver, --initial-guess and "
                        "--chunk-length (passes: exactly that many passes per solve, 0: solve to tol)."]


def solve(options: FixedPointOptions, mode: str) -> str:
    start = "the learned initial guess" if options.initial_guess_for(mode) == "learned" else "z = 0"
    if options.passes:
        how = f"exactly {options.passes} passes of plain iteration from {start}, no tolerance"
    else:
        max_iter, tol = options.budget(None, None, mode)
        how = f"{options.solver_for(mode)} from {start} to a residual below {tol:g} ({options.stop_mode}), at most {max_iter} passes"
    if mode == "simultaneous":
        how += f", in chunks of {options.chunk_length} tokens" if options.chunk_length else ", the whole sequence at once"
    return f"{how} (reports say `{options.described_solver(mode)}`)"


def write_model_card(folder: Path, model, meta: dict[str, Any]) -> None:
    (Path(folder) / MODEL_CARD).write_text(model_card(model, meta), encoding="utf-8")
