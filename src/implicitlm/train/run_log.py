"""Training logs: one JSON object per line, mirrored to TensorBoard scalars through
accelerate's tracker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..atomic_io import atomic_write

TENSORBOARD = "tensorboard"


# What a training run writes into its folder (both trainers; the word trainer's "checkpoint",
# the LM trainer's "checkpoints" and held-out curve).
RUN_ENTRIES = ("metrics.jsonl", "tensorboard", "checkpoint", "checkpoints", "lm_training.json", "lm_training.png")


def existing_run(out_dir: str | Path) -> list[str]:
    """The entries of an earlier training run in ``out_dir`` (none for a new or unrelated folder)."""
    out = Path(out_dir)
    return [name for name in RUN_ENTRIES if (out / name).exists() or (out / name).is_symlink()]


def refuse_earlier_run(out_dir: str | Path, overwrite: bool) -> None:
    """A new run may not start on top of an earlier one: it would append to the old log, and
    pruning would delete checkpoints the new run did not write. Without ``overwrite``, an
    earlier run is a FileExistsError."""
    found = existing_run(out_dir)
    if found and not overwrite:
        raise FileExistsError(
            f"{out_dir}: holds a training run ({', '.join(found)}); continue it with --resume or replace it with --overwrite"
        )


def clear_earlier_run(out_dir: str | Path) -> None:
    """Remove an earlier run's entries from ``out_dir``; other files in the folder stay."""
    for name in existing_run(out_dir):
        path = Path(out_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def tracking_options(out_dir: str | Path) -> dict[str, Any]:
    """``Accelerator`` arguments under which ``RunLog`` writes TensorBoard to ``out_dir/tensorboard``."""
    return {"log_with": TENSORBOARD, "project_dir": str(out_dir)}


class RunLog:
    """Writes on the main process only. ``accelerator``: made with ``tracking_options``.
    ``keep_before_step``: a resumed run first drops the records of steps from that one
    on, which the interrupted run logged after its last checkpoint and will log again."""

    def __init__(self, out_dir: str | Path, accelerator, keep_before_step: int | None = None) -> None:
        self.accelerator = accelerator
        self.enabled = accelerator.is_main_process
        if not self.enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if keep_before_step is not None:
            _truncate(out / "metrics.jsonl", keep_before_step)
        self._jsonl = (out / "metrics.jsonl").open("a", encoding="utf-8")
        accelerator.init_trackers(TENSORBOARD)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        # Scalars only: the phase and solver names are in the JSONL.
        self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        # Not accelerator.end_training(): that also ends the process group, which the
        # caller may still need (a final evaluation under torchrun).
        for tracker in self.accelerator.trackers:
            tracker.finish()

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _truncate(path: Path, keep_before_step: int) -> None:
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the half-written last line of a killed run
        if record.get("step", 0) < keep_before_step:
            kept.append(line + "\n")
    atomic_write(path, lambda temporary: temporary.write_text("".join(kept), encoding="utf-8"))
