"""The GPU check's A5xM step, in a process of its own (gpu_check.py --step words)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpu_check_shared import report_figures

from implicitlm import cli

# The authors' A5 x M setup (p = 0.9, train length 256, test 1024, 1-layer Mamba2 d_model 256,
# expand 4, headdim 64, d_state 128, (32+4), lr 1e-3) for a fixed number of steps: tokens/s and
# the loss after them, which runs compare (stopped at the time limit if it comes first).
WORDS = {
    "gpu": dict(length=256, test_lengths="256,1024", batch=128, steps=30, count=64, convergence_count=32,
                max_iter=64, model=["hidden_size=256", "expand=4", "head_dim=64", "state_size=128", "chunk_size=256"]),
    "rehearsal": dict(length=8, test_lengths="8", batch=8, steps=2, count=8, convergence_count=4, max_iter=4,
                      model=[]),
}
WORDS_TRAIN_SHARE = 0.6  # of the step's limit; evaluation gets the rest


def run(rehearse: bool, limit_s: float) -> None:
    """Train (stopped by SIGTERM when its share of the time is up: the trainer checkpoints on
    it), then accuracy by length and the passes of hard and easy tokens, through the
    command line."""
    size = WORDS["rehearsal" if rehearse else "gpu"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-words-") as folder:
        run_folder = Path(folder) / "run"
        figures = train_words(run_folder, size, WORDS_TRAIN_SHARE * limit_s)
        report_figures(figures)
        evaluation = ["--task", "words", str(run_folder), "--max-iter", str(size["max_iter"]), "--no-progress"]
        if cli.main(["eval", "length", *evaluation, "--lengths", size["test_lengths"], "--count", str(size["count"]),
                 "--chunk-length", "0", "--out", f"{folder}/length"]) != 0:
            raise SystemExit("eval length failed")
        figures |= record_metrics(Path(folder) / "length" / "word_length.json", r"accuracy")
        report_figures(figures)
        if cli.main(["eval", "convergence", *evaluation, "--lengths", str(size["length"]),
                 "--count", str(size["convergence_count"]), "--out", f"{folder}/convergence"]) != 0:
            raise SystemExit("eval convergence failed")
        figures |= record_metrics(Path(folder) / "convergence" / "convergence.json",
                                  r"(hard|easy) passes_mean|all share_unconverged|hard token share")
        report_figures(figures)


def train_words(run_folder: Path, size: dict[str, Any], limit_s: float) -> dict[str, Any]:
    train = dict(group="A5xM", hard_prob=0.9, sequence_length=size["length"], batch_size=size["batch"],
                 total_steps=size["steps"], warmup_steps=min(20, size["steps"]), lr=1e-3, bounded_fraction=0,
                 free_max_iter=32, free_phantom_steps=4, free_tol=0.05, checkpoint_every=0, log_every=5)
    options = [f"--train={key}={value}" for key, value in train.items()] + [f"--model={m}" for m in size["model"]]
    command = [sys.executable, "-m", "implicitlm", "words", "train", "--preset", "words_a5", "--out", str(run_folder),
               "--no-progress", *options]
    process = subprocess.Popen(command)
    try:
        code = process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        code = process.wait()
    if code not in (0, 128 + signal.SIGTERM):
        raise SystemExit(f"words train failed (exit code {code})")
    last = json.loads((run_folder / "metrics.jsonl").read_text().splitlines()[-1])
    return {"train steps (last logged)": last["step"] + 1, "stopped by the time limit": code != 0,
            "train tokens/s": round(last["tokens_per_s"]), "train loss": last["loss"], "train accuracy": last["accuracy"],
            "train solver passes": last.get("fp_passes_mean")}


def record_metrics(path: Path, pattern: str) -> dict[str, Any]:
    metrics = json.loads(path.read_text())["metrics"]
    return {key: value for key, value in metrics.items() if re.match(pattern, key)}
