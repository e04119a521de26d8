"""The state-tracking demo: implicit vs explicit Mamba2, accuracy by sequence length.

Both models have the same size and see the same training words; they are tested on
fresh words of 1x, 2x and 4x the training length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.atomic_io import write_json
from ..eval.plots import plot_figure
from ..eval.records import write_task_record
from ..tasks.words import accuracy_by_length, accuracy_figure, agreement_by_length, word_length_record
from ..core.options import Options
from ..core.schema import POSITIVE, Rule, at_least, check_known_keys
from ..presets import KINDS
from ..core.run_folder import latest_checkpoint
from ..core.targets import staged_folder
from . import DEMO_FOLDER, clock, seconds_since
from ..tasks.word_scoring import with_word_budget
from ..train.runs import word_model, word_train_config
from ..train.trainer import train

PRESET_SECTIONS = ("model", "implicit_model", "explicit_model", "train", "implicit_train", "explicit_train", "eval")


@dataclass(frozen=True)
class DemoEval(Options):
    length_multiples: tuple[int, ...] = (1, 2, 4, 8)
    count: int = 512
    # Sequential (RNN) mode runs token by token, so it is checked on fewer words.
    sequential_count: int = 64
    max_iter: int | None = None
    tol: float | None = None

    WHAT = "demo eval option"
    FIELD_RULES = {
        "length_multiples": Rule("each >= 1 (at least one)", lambda multiples: len(multiples) and min(multiples) >= 1),
        "count": at_least(1), "sequential_count": at_least(1), "max_iter": at_least(1), "tol": POSITIVE,
    }


def run_demo(
    preset: dict[str, Any], out_dir: str | Path, progress: bool = True, overwrite: bool = False,
    device: str | None = None,
) -> dict[str, Any]:
    """Train both kinds of ``preset`` and test them by length, into the folder ``out_dir``:
    built aside and renamed into place once complete; a folder already there is refused,
    before the training, unless ``overwrite`` and it holds a demo's results (whose files it
    replaces, keeping any other). ``device``: where the models train and are tested
    (``trainer.train``); ``results`` records the run's wall and CPU seconds."""
    began = clock()
    check_known_keys(preset, PRESET_SECTIONS, "preset section")
    evaluation = DemoEval.from_dict(preset.get("eval", {}))
    out_dir = Path(out_dir)
    # Both kinds' settings and models first: a bad explicit section is reported before
    # minutes of implicit training, not after.
    configs = {kind: word_train_config(preset, kind) for kind in KINDS}
    models = {kind: word_model(preset, kind, configs[kind]) for kind in KINDS}
    with staged_folder(out_dir, overwrite, DEMO_FOLDER) as staging:
        results: dict[str, Any] = {"models": {}}
        for kind in KINDS:
            entry = _train_and_test(models[kind], configs[kind], evaluation, staging, out_dir, kind, progress, device)
            results["models"][kind] = entry
            results.update(group=configs[kind].group, train_length=configs[kind].sequence_length)
        results.update(seconds_since(began))
        write_json(staging / "results.json", results)
        figure = accuracy_figure(
            {kind: entry["by_length"] for kind, entry in results["models"].items()},
            results["group"],
            f"{results['group']} word problem, trained at length {results['train_length']}",
            results["train_length"],
        )
        plot_figure(figure, staging / "accuracy_by_length.png")
    return results


def _train_and_test(
    model, config, evaluation: DemoEval, staging: Path, out_dir: Path, kind: str, progress: bool, device: str | None,
):
    """One kind's run in ``staging`` on ``device``, and its results by length; the checkpoint
    named where it will be once ``staging`` becomes ``out_dir``."""
    train(model, config, staging / kind, progress=progress, description=f"train {kind}", device=device)
    lengths = [config.sequence_length * m for m in evaluation.length_multiples]
    # The evaluation's budget, every forward's: the trained model's own options stay as trained.
    if evaluation.max_iter is None:
        fixed_point = with_word_budget(model, max(lengths))
    else:
        fixed_point = {"max_iter": evaluation.max_iter, "simultaneous_max_iter": 0}
    if evaluation.tol is not None:
        fixed_point["tol"] = evaluation.tol
    entry = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_steps": config.total_steps,
        "checkpoint": str(out_dir / latest_checkpoint(staging / kind).relative_to(staging)),
        "by_length": accuracy_by_length(model, config.group, lengths, evaluation.count, config.seed, progress=progress,
                                        fixed_point=fixed_point),
    }
    if model.config.implicit:
        # RNN mode on fewer words, which simultaneous mode solves too: the duality check.
        both = agreement_by_length(
            model, config.group, lengths, evaluation.sequential_count, config.seed, progress=progress,
            fixed_point=fixed_point)
        entry["sequential_by_length"] = [row["sequential"] for row in both]
        entry["mode_agreement"] = [
            {key: row[key] for key in ("length", "sequences", "argmax_agreement")} for row in both
        ]
    # Each model's result also as a record, for ``implicitlm report``.
    record = word_length_record(entry["by_length"], config.group, "simultaneous", config.sequence_length)
    write_task_record(staging / kind, entry["checkpoint"], model, record, fixed_point)
    return entry


def format_table(results: dict[str, Any]) -> str:
    """Per-token accuracy (last 10 tokens / all but the first) by test length, one column
    pair per model and mode, and the share of fixed points that stopped above the tolerance."""
    columns = []
    for name, entry in results["models"].items():
        columns.append((f"{name}", entry["by_length"]))
        if "sequential_by_length" in entry:
            columns.append((f"{name} (RNN mode)", entry["sequential_by_length"]))
    width = max(len(label) for label, _ in columns) + 2
    lines = [
        f"{results['group']} word problem, trained at length {results['train_length']}; "
        + ", ".join(f"{n}: {e['parameters']:,} parameters" for n, e in results["models"].items()),
        f"{'':>12}" + "".join(f"{label:>{width}}" for label, _ in columns),
        f"{'test length':>12}" + "".join(f"{'last10 / all':>{width}}" for _ in columns),
    ]
    for i, row in enumerate(columns[0][1]):
        multiple = row["length"] // results["train_length"]
        cells = "".join(
            f"{rows[i]['accuracy_last10']:.1%} / {rows[i]['accuracy']:.1%}".rjust(width) for _, rows in columns
        )
        lines.append(f"{row['length']:>7} ({multiple}x)" + cells)
    missed = [
        f"{label} {row['fp_not_converged_share']:.2%} at {row['length']}"
        for label, rows in columns for row in rows if row.get("fp_not_converged_share")
    ]
    lines.append("fixed points above the tolerance: " + (", ".join(missed) if missed else "none"))
    return "\n".join(lines)
