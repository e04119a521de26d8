"""The one JSON layout every experiment writes, so that ``implicitlm report`` can gather runs.

A record is a dict::

    experiment   what was measured ("word_length", "lm_length", "jacobian", ...)
    checkpoint   the model folder it was measured on (or a preset name for random models)
    model        architecture, implicit or not, parameter count, dtype; for an implicit model the
                 fixed-point options it was measured with and the solver of each mode
    metrics      flat {name: number}: the figures a comparison table shows
    curves       optional [{"label", "x", "y"}]: the series a comparison figure overlays,
                 with ``axes`` {"x": label, "y": label, "xscale", "yscale"} naming them
    ...          any further detail of the experiment (rows, settings)

It is written as ``<out>/<experiment>.json`` beside a ``<out>/<experiment>.png`` figure.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ..core.atomic_io import write_json
from ..core.errors import DataError, OptionError, quoted
from ..core.targets import exclusive_targets
from .plots import plot_figure

if TYPE_CHECKING:  # read, never built, here: importing tasks/ would load torch into ``report``
    from ..tasks.base import TaskRecord

RECORD_KEYS = ("experiment", "checkpoint", "model", "metrics")
# An experiment names its files in --out: a name, never a path that would lead out of it.
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
SCALES = ("linear", "log", "log2")


def model_summary(model, fixed_point: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model as it ran: its fixed-point options those of its forwards, given ``fixed_point``."""
    config = model.config
    summary = {
        "architecture": config.model_type.removeprefix("implicit_"),
        "implicit": bool(config.implicit),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
    }
    if config.implicit:
        options = model.fixed_point_options(fixed_point)
        summary["fixed_point"] = options.to_dict()
        summary["solvers"] = {mode: options.described_solver(mode) for mode in ("simultaneous", "sequential")}
    return summary


def make_record(
    experiment: str,
    checkpoint: str | Path,
    model,
    metrics: dict[str, float],
    curves: list[dict[str, Any]] | None = None,
    axes: dict[str, str] | None = None,
    fixed_point: dict[str, Any] | None = None,
    **details: Any,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "experiment": experiment,
        "checkpoint": str(checkpoint),
        "model": model_summary(model, fixed_point),
        "metrics": {name: float(value) for name, value in metrics.items()},
    }
    if curves is not None:
        record["curves"] = curves
        record["axes"] = axes or {}
    record.update(details)
    return record


def record_files(out_dir: str | Path, experiment: str) -> tuple[Path, Path]:
    """The JSON file and the figure of ``experiment``'s record in ``out_dir``."""
    return Path(out_dir) / f"{experiment}.json", Path(out_dir) / f"{experiment}.png"


@contextlib.contextmanager
def claimed_outputs(files: Iterable[str | Path], overwrite: bool = False) -> Iterator[None]:
    """Held before an evaluation's work, not after it: ``files`` (records, figures) for this
    writer alone, any that exists refused unless ``overwrite``."""
    files = list(dict.fromkeys(map(Path, files)))  # a file named twice is held once, not refused as another's
    for file in files:
        _check_folder(file.parent)
    with exclusive_targets(files, overwrite):
        yield


def claimed_records(out_dir: str | Path, experiments: Iterable[str], overwrite: bool = False):
    """``claimed_outputs`` of the records of ``experiments`` in ``out_dir``."""
    files = [file for experiment in experiments for file in record_files(out_dir, experiment)]
    return claimed_outputs(files, overwrite)


def _check_folder(folder: Path) -> None:
    """The results' folder, or the nearest of its parents that exists, is a folder."""
    existing = next(path for path in (folder, *folder.absolute().parents) if path.exists() or path.is_symlink())
    if not existing.is_dir():
        raise OptionError(f"{existing}: expected a folder for the results (--out), got a file")


def write_record(out_dir: str | Path, record: dict[str, Any]) -> Path:
    path = record_files(out_dir, record["experiment"])[0]
    write_json(path, record)
    return path


def write_task_record(out_dir: str | Path, checkpoint: str | Path, model, record: TaskRecord,
                      fixed_point: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """A task's ``record`` of ``model`` on ``checkpoint`` (its forwards given ``fixed_point``),
    written in ``out_dir`` as every record is, with its figure beside it; returns both files."""
    write_record(out_dir, make_record(record.experiment, checkpoint, model, record.metrics, record.curves, record.axes,
                                      fixed_point, **record.details))
    files = record_files(out_dir, record.experiment)
    plot_figure(record.figure, files[1])
    return files


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record in ``path``, or None for a JSON file that is not one (other outputs); a
    record with a field of the wrong kind is a DataError naming the file and the field."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: unreadable result file ({error})") from None
    if not isinstance(value, dict) or not all(key in value for key in RECORD_KEYS):
        return None
    _check_record(_Fields(path), value)
    value["metrics"] = {current_metric_name(name): number for name, number in value["metrics"].items()}
    return value


def current_metric_name(name: str) -> str:
    """``name`` as records write it now. Records written before a solve's cost had one name
    said "iterations" where they now say "passes" (``fp_iterations_mean``, ``iterations L16
    it128``, ``all iterations_mean``): read under the new name, an old run's figures fall in
    the same column of a report as a new run's."""
    return name.replace("iterations", "passes")


class _Fields:
    """The checks of a record's fields, each refusal one line naming the file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def expect(self, holds: bool, field: str, expected: str, value: Any) -> None:
        if not holds:
            raise DataError(f"{self.path}: expected field {quoted(field)} to be {expected}, got {quoted(value)}")

    def numbers(self, value: Any, field: str) -> None:
        self.expect(isinstance(value, list) and all(map(_is_number, value)), field, "a list of numbers", value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_record(fields: _Fields, record: dict[str, Any]) -> None:
    """What ``implicitlm report`` reads of a record: the name its figure takes, the model
    columns, the metrics, the curves and their axes."""
    experiment = record["experiment"]
    fields.expect(isinstance(experiment, str) and EXPERIMENT_NAME.fullmatch(experiment) is not None,
                  "experiment", "a name of letters, digits, '_', '.' and '-'", experiment)
    fields.expect(isinstance(record["checkpoint"], str), "checkpoint", "text", record["checkpoint"])
    model = record["model"]
    fields.expect(isinstance(model, dict), "model", "an object", model)
    fields.expect(isinstance(model.get("architecture"), str), "model.architecture", "text", model.get("architecture"))
    fields.expect(isinstance(model.get("implicit"), bool), "model.implicit", "true or false", model.get("implicit"))
    parameters = model.get("parameters")
    fields.expect(_is_number(parameters) and parameters >= 0, "model.parameters", "a count", parameters)
    metrics = record["metrics"]
    fields.expect(isinstance(metrics, dict), "metrics", "an object", metrics)
    for name, value in metrics.items():
        fields.expect(_is_number(value), f"metrics.{name}", "a number", value)
    if "curves" in record:
        _check_curves(fields, record["curves"], record.get("axes"))


def _check_curves(fields: _Fields, curves: Any, axes: Any) -> None:
    fields.expect(isinstance(curves, list), "curves", "a list", curves)
    for i, curve in enumerate(curves):
        fields.expect(isinstance(curve, dict), f"curves[{i}]", "an object", curve)
        fields.expect(isinstance(curve.get("label"), str), f"curves[{i}].label", "text", curve.get("label"))
        fields.numbers(curve.get("x"), f"curves[{i}].x")
        fields.numbers(curve.get("y"), f"curves[{i}].y")
        fields.expect(len(curve["y"]) == len(curve["x"]), f"curves[{i}].y", f"{len(curve['x'])} numbers, one per x",
                      curve["y"])
    fields.expect(isinstance(axes, dict), "axes", "an object", axes)
    for name, value in axes.items():
        fields.expect(isinstance(value, str), f"axes.{name}", "text", value)
    for name in ("xscale", "yscale"):
        fields.expect(axes.get(name, "linear") in SCALES, f"axes.{name}", f"one of {', '.join(SCALES)}", axes.get(name))
