"""What the GPU check's driver (gpu_check.py) and its steps (gpu_check_*.py) share: the paths,
the device, how a step reports its key figures, and the 130M preset the training, decoding and
scoring steps run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the GPU image runs this checkout's source, not an install

WHEELS = ROOT / ".gpuwheels"
SITE = Path("/tmp/gpucheck-site")  # where the wheels are installed on the GPU machine
FIGURES = "GPU-CHECK FIGURES "  # the line prefix a step reports its key figures under

INFERENCE_VARIANTS = ("explicit", "bounded")  # the implicit one: any variant decodes and scores alike
TINY_MODEL = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=16, head_dim=16)


def device(rehearse: bool) -> str:
    return "cpu" if rehearse else "cuda"


def report_figures(figures: dict[str, Any]) -> None:
    """What a step prints for the report; the driver reads the last line a step printed."""
    print(FIGURES + json.dumps(figures), flush=True)


def read_figures(output: str) -> dict[str, Any]:
    lines = [line[len(FIGURES):] for line in output.splitlines() if line.startswith(FIGURES)]
    return json.loads(lines[-1]) if lines else {}


def preset_model(variant: str, rehearse: bool, batch: int, length: int):
    """The 130M preset's ``variant`` (tiny on a CPU), random weights, on the step's device, and
    random token ids of ``batch`` x ``length``."""
    import torch

    from implicitlm.models import build_model, config_from_options
    from implicitlm.presets import model_preset

    options = model_preset(f"mamba2-130m-{variant}") | (TINY_MODEL if rehearse else {})
    torch.manual_seed(0)
    model = build_model(config_from_options(options)).to(device(rehearse))
    return model, torch.randint(0, options["vocab_size"], (batch, length), device=device(rehearse))
