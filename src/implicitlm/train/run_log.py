"""Training logs: one JSON object per line, mirrored to TensorBoard scalars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


class RunLog:
    def __init__(self, out_dir: str | Path, enabled: bool = True) -> None:
        self.enabled = enabled
        if not enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
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
