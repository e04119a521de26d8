"""Training logs: one JSON object per line, mirrored to TensorBoard scalars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from ..atomic_io import atomic_write


class RunLog:
    """``keep_before_step``: a resumed run first drops the records of steps from that one
    on, which the interrupted run logged after its last checkpoint and will log again."""

    def __init__(self, out_dir: str | Path, enabled: bool = True, keep_before_step: int | None = None) -> None:
        self.enabled = enabled
        if not enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if keep_before_step is not None:
            _truncate(out / "metrics.jsonl", keep_before_step)
        self._jsonl = (out / "metrics.jsonl").open("a", encoding="utf-8")
        self._tensorboard = SummaryWriter(log_dir=str(out / "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self._tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tensorboard.close()

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
