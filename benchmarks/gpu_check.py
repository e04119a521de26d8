"""The GPU check: every CUDA path, in order of value, in one command for a GPU at hand for minutes only.

    bash scripts/gpu-check.sh --prepare                     # here (network): wheels into .gpuwheels/
    bash scripts/gpu-check.sh [--out DIR] [--budget S]      # on the GPU machine (no network)
    bash scripts/gpu-check.sh --rehearse [--out DIR]        # here: the same steps on the CPU, tiny

This file is the driver; each step is a process of its own with its own time limit, its output
appended to a log in the output folder: this file with ``--step NAME``, which runs
gpu_check_NAME.py (what they share: gpu_check_shared.py), pytest with gpu_check_tests.py, or
benchmarks/run.py; ``--prepare`` is gpu_check_wheels.py. The steps: setup (install the wheels, versions, whether the library finds the fused
kernel), decoding (ms/token at batch 1, the 130M implicit against the explicit, eager and from
captured CUDA graphs), training (the 130M preset's step, bf16 autocast: explicit, bounded, free,
tokens/s and peak memory), scoring (8 x 2,048 tokens through the 130M, implicit against
explicit), kernel (mamba_ssm's fused SSD against the pure scan and a float64 oracle, outputs and
gradients, fp32 and bf16), tests (the ``device``-marked tests on cuda, the files nearest the
130M path first), words (a fixed number of A5xM steps at length 256), benchmarks
(benchmarks/run.py --quick).

The order is what each figure is worth against what it costs on a fresh machine: Triton
autotunes mamba_ssm's kernels once per chunk, head and state size and dtype (a minute or more
each on an H100), so the steps share one Triton cache folder (``TRITON_CACHE_DIR``, tuning
kept), and the 130M shapes the training step tunes serve the scoring and kernel steps. Every
step has a limit of its own but the tests, which get what the steps after them leave; the whole
check ends within the budget (nine minutes by default). ``report.md`` and ``summary.json`` are
rewritten after every step, so a run cut off still leaves what it measured; the output folder
holds at most 8 files, so that a remote machine that returns a few files of output returns it
whole.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpu_check_shared import ROOT, SITE, WHEELS, device, read_figures
from gpu_check_tests import tests_command, read_pytest
from gpu_check_wheels import prepare

from implicitlm.core.atomic_io import atomic_write, write_json

DEFAULT_OUT = ROOT / "gpu-check-out"
# Nine minutes: room for the machine's start inside a quarter of an hour on a GPU.
# On the H200 Triton's autotuning took most of 480 s (80 s for the SSD kernel's first shape).
DEFAULT_BUDGET_S = 540.0
# Shared by every step, outside the output folder (which stays at 8 files); a user's own
# TRITON_CACHE_DIR is used instead.
TRITON_CACHE = Path(tempfile.gettempdir()) / "gpucheck-triton-cache"

# ---------------------------------------------------------------- the steps and their budgets


@dataclass(frozen=True)
class Step:
    name: str
    log: str  # steps share logs: the folder stays at 8 files or fewer
    # Its limit; None: the time left less the limits of the steps after it, which stay theirs.
    limit_s: float | None


# The limits from the GPU runs of 2026-11-27: the training step took 51 s with its kernels
# tuned (and about a minute more for each new kernel shape's tuning), the 130M decoding, eager
# and graphed, 40 s. Within the default budget the tests get what the others leave: a minute
# or more.
STEPS = [
    Step("setup", "setup.log", 60.0),
    Step("decoding", "benchmarks.log", 60.0),
    Step("training", "benchmarks.log", 150.0),
    Step("scoring", "benchmarks.log", 45.0),
    Step("kernel", "kernel.log", 60.0),
    Step("tests", "tests.log", None),
    Step("words", "words.log", 60.0),
    Step("benchmarks", "benchmarks.log", 20.0),
]
# Below this a step could not even import torch and its model: it is skipped instead.
MINIMUM_STEP_S = 10.0

# generate()'s ms/token, the one section that fits the step's limit: decoding, scoring and the
# training step have steps of their own; chunked and solvers run by hand (benchmarks/run.py);
# multiple_choice needs lm-eval and ../shared/data, which the GPU machine lacks; data_generation
# measures the CPU's word generation; mixer's baseline, transformers' Mamba2, takes its CUDA
# path only with causal-conv1d's CUDA build, which the GPU machine lacks ("'NoneType' object is
# not callable" there).
GPU_SECTIONS = "generation"
REHEARSED_SECTIONS = "training_step"  # the one section that takes seconds on a CPU
# Steps whose kernels keep their smallest configuration, untuned (layers/ssd_kernel.py): those
# that check results, not speed, and the A5xM run and the small benchmarks, whose many shapes
# and float32 each cost a minute of tuning that filled their limits on a fresh machine (the
# GPU runs of 2026-11-27). Timed against their own explicit twins, on the same kernels.
UNTUNED_STEPS = ("kernel", "tests", "words", "benchmarks")
KERNEL_TUNING = "IMPLICITLM_KERNEL_TUNING"  # the library's switch, read without importing torch here


@dataclass
class Result:
    step: str
    status: str  # ok, failed, timed out, skipped
    seconds: float = 0.0
    limit_s: float = 0.0
    returncode: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    log: str = ""


def step_command(name: str, rehearse: bool, limit_s: float) -> list[str]:
    if name == "tests":
        return tests_command(rehearse)
    if name == "benchmarks":
        sections = REHEARSED_SECTIONS if rehearse else GPU_SECTIONS
        return [sys.executable, "benchmarks/run.py", "--quick", "--device", device(rehearse), "--only", sections]
    return [sys.executable, __file__, "--step", name, "--limit", f"{limit_s:.0f}"] + (["--rehearse"] if rehearse else [])


def step_environment(name: str, rehearse: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["IMPLICITLM_TEST_DEVICE"] = device(rehearse)
    if rehearse:
        # Tiny models on a CPU that others may share: a second thread only adds waiting.
        env["OMP_NUM_THREADS"] = "1"
    if rehearse and name == "kernel":
        env["TRITON_INTERPRET"] = "1"  # read once, when triton is first imported
    env["PYTHONPATH"] = os.pathsep.join(path for path in (str(ROOT / "benchmarks"), env.get("PYTHONPATH")) if path)
    # Triton autotunes mamba_ssm's kernels at every new shape (80 s of a first call on an H200)
    # and forgets it with the process; kept in one cache folder, a shape one step tuned is not
    # tuned again by the next. The library keeps the tuning too (layers/ssd_kernel.py); said
    # here as well, since a step may import the kernels first.
    env["TRITON_CACHE_AUTOTUNING"] = "1"
    if name in UNTUNED_STEPS:
        env[KERNEL_TUNING] = "smallest"
    env.setdefault("TRITON_CACHE_DIR", str(TRITON_CACHE))
    if not rehearse:
        paths = [str(SITE), str(ROOT / "src"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


# ---------------------------------------------------------------- the driver


def run_all(out: Path, rehearse: bool, budget_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name in {step.log for step in STEPS}:
        (out / name).unlink(missing_ok=True)  # a previous run's log would be appended to
    if not rehearse:
        shutil.rmtree(SITE, ignore_errors=True)
        SITE.mkdir(parents=True)  # before any step starts: an interpreter skips a missing path for good
    started, results = time.monotonic(), []
    for index, step in enumerate(STEPS):
        left = budget_s - (time.monotonic() - started)
        results.append(run_step(step, step_limit(step, STEPS[index + 1:], left), out, rehearse))
        write_report(out, results, rehearse, budget_s, time.monotonic() - started)
    print((out / "report.md").read_text())
    return 0 if all(result.status == "ok" for result in results) else 1


def step_limit(step: Step, after: list[Step], left_s: float) -> float:
    """Its own limit, within the time left; a step without one gets what the steps ``after``
    it leave of the time left (their limits kept for them), so the time others leave unused
    goes to it."""
    if step.limit_s is not None:
        return min(step.limit_s, left_s)
    return max(0.0, left_s - sum(s.limit_s or 0.0 for s in after))


def run_step(step: Step, limit_s: float, out: Path, rehearse: bool) -> Result:
    result = Result(step.name, "skipped", limit_s=round(limit_s, 1), log=step.log)
    if limit_s < MINIMUM_STEP_S:
        result.figures["why"] = "no time left in the budget"
        return result
    command = step_command(step.name, rehearse, limit_s)
    log = out / step.log
    with open(log, "a") as handle:
        handle.write(f"\n===== {step.name}: {' '.join(command)} (limit {limit_s:.0f} s)\n")
        offset = handle.tell()
    started = time.monotonic()
    result.returncode, timed_out = run_limited(command, step_environment(step.name, rehearse), log, limit_s)
    result.seconds = round(time.monotonic() - started, 1)
    result.status = "timed out" if timed_out else ("ok" if result.returncode == 0 else "failed")
    with open(log) as handle:
        handle.seek(offset)
        result.figures = FIGURE_READERS.get(step.name, read_figures)(handle.read())
    if step.name in UNTUNED_STEPS:
        result.figures["kernels"] = "untuned (smallest configuration)"
    print(f"{step.name}: {result.status} in {result.seconds:.0f} s", flush=True)
    return result


def run_limited(command: list[str], env: dict[str, str], log: Path, limit_s: float) -> tuple[int | None, bool]:
    """Run ``command`` in its own process group, output appended to ``log``; past the limit the
    group gets SIGTERM (a training run checkpoints on it), then SIGKILL."""
    with open(log, "a") as handle:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            stop_group(process)
            return process.returncode, True


def stop_group(process: subprocess.Popen) -> None:
    for stop, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, stop)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
            return


# ---------------------------------------------------------------- key figures and the report


def read_benchmark_tables(output: str) -> dict[str, Any]:
    """benchmarks/run.py's tables: how many, and the targets met and missed by section."""
    titles = re.findall(r"^### (.*)$", output, flags=re.MULTILINE)
    verdicts = re.findall(r"^- target .*?: (met|NOT met)", output, flags=re.MULTILINE)
    figures: dict[str, Any] = {"tables": len(titles), "targets met": verdicts.count("met")}
    missed = [title.split(",")[0] for title, verdict in zip(titles, verdicts) if verdict == "NOT met"]
    if missed:
        figures["targets NOT met"] = missed
    return figures


FIGURE_READERS: dict[str, Callable[[str], dict[str, Any]]] = {"tests": read_pytest, "benchmarks": read_benchmark_tables}


def write_report(out: Path, results: list[Result], rehearse: bool, budget_s: float, elapsed_s: float) -> None:
    done = {result.step for result in results}
    pending = [Result(step.name, "not run yet", log=step.log) for step in STEPS if step.name not in done]
    summary = {
        "mode": "rehearsal (cpu, tiny shapes)" if rehearse else "gpu",
        "budget_s": budget_s,
        "elapsed_s": round(elapsed_s, 1),
        "complete": not pending,
        "steps": [vars(result) for result in results + pending],
    }
    write_json(out / "summary.json", summary)
    text = report_markdown(summary)
    atomic_write(out / "report.md", lambda temporary: temporary.write_text(text))


def report_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# GPU check: {summary['mode']}", "",
             f"{summary['elapsed_s']:.0f} s of a {summary['budget_s']:.0f} s budget; logs beside this file.", "",
             "| step | status | seconds | limit s | key figures |", "|---|---|---|---|---|"]
    for step in summary["steps"]:
        lines.append(f"| {step['step']} | {step['status']} | {step['seconds']:.0f} | {step['limit_s']:.0f} | "
                     f"{format_figures(step['figures'])} |")
    return "\n".join(lines) + "\n"


def format_figures(figures: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, list):
            return ", ".join(map(str, v))
        return str(v)

    return "; ".join(f"{key} {value(v)}" for key, v in figures.items()).replace("|", "/")


# ---------------------------------------------------------------- command line

# The steps this file runs in a process of its own (--step NAME): gpu_check_NAME.py's run().
STEP_MODULES = ("setup", "decoding", "training", "scoring", "kernel", "words")


def positive_seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prepare", action="store_true", help=f"fill {WHEELS.name}/ with the wheels the GPU image needs")
    mode.add_argument("--rehearse", action="store_true", help="run every step on this machine's CPU, tiny")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"report folder (default: $OUT if set, else {DEFAULT_OUT.relative_to(ROOT)}/)")
    parser.add_argument("--budget", type=positive_seconds, default=DEFAULT_BUDGET_S, help="seconds for all the steps")
    parser.add_argument("--step", choices=STEP_MODULES, help=argparse.SUPPRESS)  # one step, in its own process
    parser.add_argument("--limit", type=positive_seconds, default=DEFAULT_BUDGET_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        importlib.import_module(f"gpu_check_{args.step}").run(args.rehearse, args.limit)
        return 0
    if args.prepare:
        prepare()
        return 0
    out = args.out or Path(os.environ.get("OUT") or DEFAULT_OUT)
    return run_all(out.absolute(), args.rehearse, args.budget)


if __name__ == "__main__":
    sys.exit(main())
