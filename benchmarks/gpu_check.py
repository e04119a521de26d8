"""The GPU check: every CUDA path, in order of value, in one command for a GPU at hand for minutes only.

    bash scripts/gpu-check.sh --prepare                     # here (network): wheels into .gpuwheels/
    bash scripts/gpu-check.sh [--out DIR] [--budget S]      # on the GPU machine (no network)
    bash scripts/gpu-check.sh --rehearse [--out DIR]        # here: the same steps on the CPU, tiny

Steps, each a subprocess of this file with its own time limit, its output appended to a log in
the output folder: setup (install the wheels, versions, whether the library finds the fused
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
import json
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the GPU image runs this checkout's source, not an install

from implicitlm.core.atomic_io import atomic_write, staged_directory, write_json  # noqa: E402

WHEELS = ROOT / ".gpuwheels"
SITE = Path("/tmp/gpucheck-site")  # where the wheels are installed on the GPU machine
DEFAULT_OUT = ROOT / "gpu-check-out"
# Nine minutes: room for the machine's start inside a quarter of an hour on a GPU.
# On the H200 Triton's autotuning took most of 480 s (80 s for the SSD kernel's first shape).
DEFAULT_BUDGET_S = 540.0
FIGURES = "GPU-CHECK FIGURES "  # the line prefix a step reports its key figures under
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

# The files of the tests marked `device` (built on the `device` fixture's device): only they are
# collected, since other test files import what the GPU machine lacks (lm-eval), which fails
# their collection.
TEST_FILES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                    if "@pytest.mark.device" in path.read_text())
# First the files nearest what a user runs on a GPU (graphed decoding, the trainer's bf16
# autocast, the fused kernel against the pure scan, the Mamba2 models and their generation): a run cut off at its limit
# has checked those. Each test model's new shape costs a tuning; the other files follow.
FIRST_TEST_FILES = ["tests/models/test_token_graphs.py", "tests/train/test_lm_train.py", "tests/layers/test_ssd.py",
                    "tests/models/test_mamba2.py", "tests/models/test_generation.py", "tests/models/test_precision.py"]
TEST_FILES.sort(key=lambda name: FIRST_TEST_FILES.index(name) if name in FIRST_TEST_FILES else len(FIRST_TEST_FILES))
REHEARSED_TESTS = "test_steps_match_parallel_from_zero_state or test_gradients_match_recurrence"
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
    python = sys.executable
    if name == "tests":
        # -v: a line per test, so a run cut off by its limit still says how far it got;
        # --durations: where the time went (the first calls compile and autotune the kernels);
        # a file that imports what the GPU machine lacks is reported, the others still run.
        command = [python, "-m", "pytest", "-o", "addopts=", "-v", "-rfE", "--tb=short", "--durations=5",
                   "-p", "no:cacheprovider", "--continue-on-collection-errors", "-m", "device", *TEST_FILES]
        command += ["-p", "gpu_check"]  # this file, for pytest_runtest_logreport below
        return command + ["-k", REHEARSED_TESTS] if rehearse else command
    if name == "benchmarks":
        sections = REHEARSED_SECTIONS if rehearse else GPU_SECTIONS
        return [python, "benchmarks/run.py", "--quick", "--device", device(rehearse), "--only", sections]
    return [python, __file__, "--step", name, "--limit", f"{limit_s:.0f}"] + (["--rehearse"] if rehearse else [])


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


def device(rehearse: bool) -> str:
    return "cpu" if rehearse else "cuda"


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


def report_figures(figures: dict[str, Any]) -> None:
    """What a step prints for the report; the driver reads the last line a step printed."""
    print(FIGURES + json.dumps(figures), flush=True)


def read_figures(output: str) -> dict[str, Any]:
    lines = [line[len(FIGURES):] for line in output.splitlines() if line.startswith(FIGURES)]
    return json.loads(lines[-1]) if lines else {}


def read_pytest(output: str) -> dict[str, Any]:
    """Counts from pytest's last line ("3 failed, 40 passed, 1 skipped in 9.1s"), else, from a
    run cut off before it, from its line per test; and the failed tests' names."""
    figures: dict[str, Any] = {}
    summaries = re.findall(r"^=+ (.*\d+ (?:passed|failed|errors?|skipped).*) =+$", output, flags=re.MULTILINE)
    if summaries:
        for count, outcome in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summaries[-1]):
            figures[outcome.removesuffix("s") if outcome.startswith("error") else outcome] = int(count)
    else:
        outcomes = re.findall(r"^\S+::\S+ (PASSED|FAILED|SKIPPED|ERROR)", output, flags=re.MULTILINE)
        figures = {outcome.lower(): outcomes.count(outcome) for outcome in sorted(set(outcomes))}
        figures["cut off after"] = len(outcomes)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)))
    if failed:
        figures["failed tests"] = failed[:8]
    return figures


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


# ---------------------------------------------------------------- step: setup


def setup_step(rehearse: bool, limit_s: float) -> None:
    """Install the wheels (GPU machine), then the versions that run and whether the library
    finds mamba_ssm's fused kernel."""
    figures: dict[str, Any] = {}
    if not rehearse:
        figures["wheels"] = install_wheels()
    report_figures(figures | environment())


def install_wheels() -> int:
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {WHEELS}: run `bash scripts/gpu-check.sh --prepare` where there is a network")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(SITE), *map(str, wheels)], check=True)
    without_cuda_extension_import(SITE / "mamba_ssm" / "__init__.py")
    import importlib

    importlib.invalidate_caches()
    return len(wheels)


def without_cuda_extension_import(init: Path) -> None:
    """mamba_ssm's ``__init__`` imports its compiled CUDA extension (selective_scan_cuda),
    which a wheel built with MAMBA_SKIP_CUDA_BUILD lacks, so ``import mamba_ssm`` fails and
    the library would fall back to the pure scan everywhere. Only its Triton kernels are
    used: the installed ``__init__`` keeps its version and nothing else."""
    version = [line for line in init.read_text().splitlines() if line.startswith("__version__")]
    note = "# Emptied by benchmarks/gpu_check.py: see without_cuda_extension_import."
    init.write_text("\n".join([note, *version]) + "\n")


def environment() -> dict[str, Any]:
    from importlib import metadata

    import torch
    from implicitlm.layers.ssd_kernel import fused_ssd_kernel

    names = ["torch", "triton", "transformers", "tokenizers", "huggingface-hub", "accelerate", "safetensors",
             "datasets", "pyarrow", "torchdeq", "mamba-ssm", "einops", "numpy"]
    versions = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    figures: dict[str, Any] = {"python": sys.version.split()[0], "versions": [f"{k} {v}" for k, v in versions.items()]}
    if torch.cuda.is_available():
        figures["gpu"] = torch.cuda.get_device_name()
    figures["library finds the fused kernel"] = fused_ssd_kernel() is not None
    wrong = unmet(declared_dependencies() + travelling_requirements())
    if wrong:
        figures["unmet requirements"] = wrong
    return figures


def declared_dependencies() -> list[str]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["dependencies"]


def travelling_requirements() -> list[str]:
    """What the installed wheels require of the image (pip installed them without it).
    mamba-ssm's are left out: only its Triton kernels run, which need none of them."""
    from importlib import metadata

    wheels = [dist for dist in metadata.distributions(path=[str(SITE)]) if canonical(dist.metadata["Name"]) != "mamba-ssm"]
    return [requirement for dist in wheels for requirement in dist.requires or []]


def unmet(requirements: list[str]) -> list[str]:
    """The requirements (pip's syntax) that this environment misses or holds at a version outside them."""
    from importlib import metadata

    from packaging.requirements import Requirement

    wrong = set()
    for requirement in map(Requirement, requirements):
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            wrong.add(f"{requirement.name} missing")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            wrong.add(f"{requirement.name} {version}, not {requirement.specifier}")
    return sorted(wrong)


# ---------------------------------------------------------------- step: kernel

# (batch, length, heads, headdim, groups, d_state, chunk, with an initial state)
# On a GPU every shape has the 130M mixer's heads, head and state sizes and chunk, which are
# what Triton tunes the kernels for (the length and groups are not): the training step has
# tuned them in bf16 already, and the fp32 tuning is paid once for all three.
KERNEL_SHAPES = {
    "gpu": [
        (1, 1000, 24, 64, 1, 128, 256, False),  # the 130M model's mixer, from a zero state
        (2, 700, 24, 64, 2, 128, 256, True),  # a partial last chunk, two groups
        (3, 100, 24, 64, 4, 128, 256, True),  # shorter than one chunk, six heads a group
    ],
    # Triton's interpreter takes seconds per call; its bfloat16 is not the GPU's (it returns
    # garbage), so the rehearsal checks float32 only.
    "rehearsal": [(2, 24, 4, 8, 2, 8, 16, True)],
}
# Relative error ||fused - oracle|| / ||oracle|| allowed, by dtype. float32: the kernel's dots
# run in TF32 (10-bit mantissa, ~5e-4 per product; sums of hundreds stay near 1e-3), and a
# convention error (B and C swapped, a wrong state layout) gives errors of order 1. bfloat16:
# inputs and outputs rounded to 8 bits (~4e-3 each), a few of them compounding.
KERNEL_THRESHOLDS = {"float32": 5e-3, "bfloat16": 3e-2}
# A limit of the precision itself, which the pure scan at the same precision shows too (a
# gradient summed over the whole sequence, as dA), is not held against the kernel. On a GPU the
# pure scan's float32 products are TF32 as the kernel's are (torch's "high" matmul precision):
# in IEEE float32 a sum with cancellations, as dA over a 100-token batch of three, is exact where
# TF32 is not (the H100 run of 2026-11-27: kernel 6.2e-3, IEEE pure scan 6.2e-6). The kernel
# rounds more of its sums' terms to TF32 than the pure scan's matmuls do (its chunk states and
# their passing): 2.3 times the pure scan's TF32 error there (2.7e-3), so a margin of 3. With
# IEEE dots (TRITON_F32_DEFAULT=ieee) the kernel's float32 errors fall to 1-5e-6.
PURE_MARGIN = 3.0
KERNEL_QUANTITIES = ["y", "final state", "dx", "ddt", "dA", "dB", "dC", "dstate"]


def kernel_step(rehearse: bool, limit_s: float) -> None:
    """mamba_ssm's fused SSD through the library's dispatch (``ssd_scan``) and the pure scan
    (``ssd_chunked``) at each dtype, both against the pure scan in float64 on the same
    (dtype-rounded) inputs; the float64 scan against the token-by-token recurrence first."""
    import torch

    dtypes = ["float32"] if rehearse else ["float32", "bfloat16"]
    figures: dict[str, Any] = {"checks": 0, "failed": 0}
    with fused_dispatch(rehearse) as kernel:
        figures["oracle vs recurrence"] = oracle_against_recurrence(device(rehearse))
        print(f"{'shape':<40}{'dtype':<10}{'quantity':<13}{'fused':>10}{'pure':>10}{'limit':>9}  verdict", flush=True)
        for shape in KERNEL_SHAPES["rehearsal" if rehearse else "gpu"]:
            for dtype in dtypes:
                calls, started = len(kernel.calls), time.perf_counter()
                compare_kernel(shape, getattr(torch, dtype), device(rehearse), figures)
                # The first call of a dtype compiles and autotunes the kernels.
                figures.setdefault(f"{dtype} first call s", round(time.perf_counter() - started, 1))
                if len(kernel.calls) == calls:
                    figures.setdefault("not dispatched to the kernel", []).append(dtype)
                report_figures(figures)
    if figures["failed"] or "not dispatched to the kernel" in figures:
        raise SystemExit(f"{figures['failed']} of {figures['checks']} kernel checks above their limit, "
                         f"{len(figures.get('not dispatched to the kernel', []))} not run by the kernel")


@contextlib.contextmanager
def fused_dispatch(rehearse: bool):
    """Inside, ``ssd_scan`` runs mamba_ssm's fused kernel and records each call (the tests'
    ``FusedKernel``): on a GPU as the library finds it, on a CPU through Triton's interpreter
    and the tests' shims (tests/support/interpreted_kernel.py)."""
    import importlib

    import pytest

    sys.path.insert(0, str(ROOT))
    from tests.support.interpreted_kernel import FusedKernel, interpreted_fused_kernel, kernel_packages_missing

    with pytest.MonkeyPatch.context() as monkeypatch:
        if rehearse:
            if kernel_packages_missing():
                raise SystemExit(kernel_packages_missing())
            with interpreted_fused_kernel(monkeypatch) as kernel:
                yield kernel
            return
        from implicitlm.layers.ssd_kernel import fused_ssd_kernel

        if fused_ssd_kernel() is None:
            raise SystemExit("the library does not find mamba_ssm's fused kernel (see the setup step)")
        yield FusedKernel(importlib.import_module("mamba_ssm.ops.triton.ssd_combined"), monkeypatch)


def kernel_inputs(shape: tuple, device_name: str) -> list:
    """x, dt (softplus'd), A (negative), B, C, initial state (or None), in float32."""
    import torch

    batch, length, heads, headdim, groups, d_state, _, with_state = shape
    generator = torch.Generator().manual_seed(sum(shape[:6]))

    def randn(*dims):
        return torch.randn(*dims, generator=generator).to(device_name)

    x, dt = randn(batch, length, heads, headdim), torch.nn.functional.softplus(randn(batch, length, heads))
    A, B, C = -torch.exp(randn(heads)), randn(batch, length, groups, d_state), randn(batch, length, groups, d_state)
    return [x, dt, A, B, C, randn(batch, heads, headdim, d_state) if with_state else None]


def scan_with_gradients(scan: Callable, leaves: list, chunk: int) -> list:
    """Outputs and the gradients of every input, of a weighted sum whose weights are fixed."""
    import torch

    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in leaves]
    y, final = scan(*leaves[:5], chunk, initial_state=leaves[5])
    generator = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device) for t in (y, final)]
    (sum((t.double() * w).sum() for t, w in zip((y, final), weights))).backward()
    return [y.detach(), final.detach()] + [None if t is None else t.grad for t in leaves]


def compare_kernel(shape: tuple, dtype, device_name: str, figures: dict[str, Any]) -> None:
    from implicitlm.layers import ssd_chunked, ssd_scan

    chunk = shape[6]
    x, dt, A, B, C, state = kernel_inputs(shape, device_name)
    # As the model hands them over: A and the state stay float32 whatever the activations' dtype.
    rounded = [x.to(dtype), dt.to(dtype), A, B.to(dtype), C.to(dtype), state]
    oracle = scan_with_gradients(ssd_chunked, [None if t is None else t.double() for t in rounded], chunk)
    fused = scan_with_gradients(ssd_scan, rounded, chunk)
    with matmul_precision("high" if device_name == "cuda" else "highest"):
        pure = scan_with_gradients(ssd_chunked, rounded, chunk)
    name = "b{}-l{}-h{}-p{}-g{}-n{}-chunk{}".format(*shape[:7]) + ("" if shape[7] else "-zero-state")
    dtype_name = str(dtype).removeprefix("torch.")
    limit = KERNEL_THRESHOLDS[dtype_name]
    for quantity, got, mine, want in zip(KERNEL_QUANTITIES, fused, pure, oracle):
        if want is None:
            continue
        error, pure_error = relative_error(got, want), relative_error(mine, want)
        passed = error <= max(limit, PURE_MARGIN * pure_error)
        figures["checks"] += 1
        figures["failed"] += not passed
        key = f"{dtype_name} max rel err"
        if error >= figures.get(key, -1.0):
            figures[key], figures[f"{dtype_name} worst"] = error, f"{quantity} at {name}"
        print(f"{name:<40}{dtype_name:<10}{quantity:<13}{error:>10.2e}{pure_error:>10.2e}{limit:>9.0e}  "
              f"{'ok' if passed else 'ABOVE LIMIT'}", flush=True)


@contextlib.contextmanager
def matmul_precision(precision: str):
    """torch's float32 matmul precision inside ("high": TF32 on CUDA), restored after."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def relative_error(got, want) -> float:
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def oracle_against_recurrence(device_name: str) -> float:
    """The float64 chunked scan, the oracle here, against the naive recurrence (its own oracle
    in the tests) on a short input with a partial chunk: rounding only, ~1e-15."""
    from implicitlm.layers import ssd_chunked, ssd_reference

    shape = (2, 40, 4, 16, 2, 16, 16, True)
    x, dt, A, B, C, state = (t.double() for t in kernel_inputs(shape, device_name))
    y, final = ssd_chunked(x, dt, A, B, C, shape[6], initial_state=state)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, initial_state=state)
    return max(relative_error(y, y_ref), relative_error(final, final_ref))


# ---------------------------------------------------------------- step: training

TRAINING_VARIANTS = ("explicit", "bounded", "free")
# (batch, length, timed repeats): the 130M preset at the paper's context on a GPU; on a CPU
# the same presets (fixed-point budgets included) at a tiny width.
TRAINING_SIZES = {"gpu": (8, 1024, 3), "rehearsal": (2, 16, 1)}
TINY_MODEL = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=16, head_dim=16)


def training_step_figures(rehearse: bool, limit_s: float) -> None:
    """The 130M preset's training step (forward, loss, backward) under bf16 autocast, as
    the trainers run it on CUDA: explicit, bounded (4+1) and free (24+4)."""
    import torch

    from common import median_seconds
    from training_step import peak_memory, training_step

    batch, length, repeats = TRAINING_SIZES["rehearsal" if rehearse else "gpu"]
    device_name, figures = device(rehearse), {}
    for variant in TRAINING_VARIANTS:
        model, ids = preset_model(variant, rehearse, batch, length)
        model.train()
        with torch.autocast(device_name, dtype=torch.bfloat16):
            # The first step compiles and tunes the kernels (once per process, or once for all
            # of them where Triton's cache keeps the tuning): what a user's first step costs.
            started = time.perf_counter()
            training_step(model, ids)
            figures[f"{variant} first step s"] = round(time.perf_counter() - started, 2)
            seconds = median_seconds(lambda: training_step(model, ids), repeats, warmup=0)
            figures[f"{variant} tokens/s"] = round(batch * length / seconds)
            if device_name == "cuda":
                figures[f"{variant} peak GiB"] = round(peak_memory(model, ids), 2)
            if variant != "explicit":
                with torch.no_grad():
                    figures[f"{variant} solver passes"] = int(model(ids).fixed_point.evaluations)
        print(f"{variant}: {seconds:.3f} s per step of {batch} x {length} tokens", flush=True)
        report_figures(figures)
        del model
        if device_name == "cuda":
            torch.cuda.empty_cache()


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


# ---------------------------------------------------------------- step: decoding

# The 130M at batch 1: (prompt tokens, decoded tokens, repeats). The prompt is read token by
# token too (sequential), so no step here tunes the fused kernel.
DECODING_130M = {"gpu": (16, 32, 5), "rehearsal": (4, 2, 1)}
INFERENCE_VARIANTS = ("explicit", "bounded")  # the implicit one: any variant decodes alike
DECODING_PASSES = (8, 2)


def token_seconds(model, ids, prompt_tokens: int, passes: int, graphed: bool, repeats: int) -> tuple[float, float]:
    """(the first call's seconds, the median's per token) of decoding ``ids`` after a prompt of
    ``prompt_tokens`` (read token by token), ``passes`` a token; ``graphed``: inside
    ``decoding_graphs``, whose first call captures the graphs."""
    import torch

    from common import synchronize

    budget = {"passes": passes} if model.config.implicit else {}
    tokens = ids.shape[1] - prompt_tokens

    @torch.no_grad()
    def decode() -> float:
        state = model(ids[:, :prompt_tokens], use_cache=True, mode="sequential", **budget).state
        synchronize(str(ids.device))
        started = time.perf_counter()
        for t in range(prompt_tokens, ids.shape[1]):
            state = model(ids[:, t : t + 1], state=state, mode="sequential", **budget).state
        synchronize(str(ids.device))
        return time.perf_counter() - started

    with model.decoding_graphs() if graphed else contextlib.nullcontext():
        first = decode()  # allocations, kernels compiled where any, and graphs captured
        return first, sorted(decode() for _ in range(repeats))[repeats // 2] / tokens


def decoding_figures(rehearse: bool, limit_s: float) -> None:
    """ms/token at batch 1: the 130M explicit and implicit (K passes a token, K = 8 as
    benchmarks/decoding.py's budget and the shipped K = 2), eager and from captured CUDA graphs
    (``decoding_graphs``). benchmarks/decoding.py's small models at positions near and far are
    left to benchmarks/run.py: their prefill of 4,096 tokens tunes the fused kernel at shapes of
    their own, a minute of the step's limit (the H200 run of 2026-11-27)."""
    prompt_tokens, tokens, repeats = DECODING_130M["rehearsal" if rehearse else "gpu"]
    figures: dict[str, Any] = {}
    for variant in INFERENCE_VARIANTS:
        model, ids = preset_model(variant, rehearse, 1, prompt_tokens + tokens)
        model.eval()
        for passes in DECODING_PASSES if model.config.implicit else (1,):
            for graphed in (False, True):
                name = f"130M {variant}{f' {passes} passes' if model.config.implicit else ''}{' graphed' * graphed}"
                first, seconds = token_seconds(model, ids, prompt_tokens, passes, graphed, repeats)
                figures[f"{name} ms/token"] = round(seconds * 1e3, 3)
                if graphed:
                    figures[f"{name} first call s"] = round(first, 2)
                print(f"{name}: {figures[f'{name} ms/token']} ms/token", flush=True)
                report_figures(figures)
        del model
    for passes in DECODING_PASSES:
        for graphed in ("", " graphed"):
            # Item 2's measure: an implicit token against as many explicit ones as it has passes.
            implicit = figures[f"130M bounded {passes} passes{graphed} ms/token"]
            figures[f"130M implicit / ({passes} x explicit){graphed}"] = round(
                implicit / (passes * figures[f"130M explicit{graphed} ms/token"]), 2)
    report_figures(figures)


# ---------------------------------------------------------------- step: scoring

# (batch, length, timed repeats): lm eval's windows of the paper's context, a batch of 8.
SCORING_SIZES = {"gpu": (8, 2048, 3), "rehearsal": (2, 16, 1)}


def scoring_figures(rehearse: bool, limit_s: float) -> None:
    """One forward of 8 x 2,048 tokens (logits and all), without gradients, under bf16 autocast
    (the training step's kernel shapes, tuned already): the 130M implicit, its own budget and
    tolerance, against the explicit."""
    import torch

    from common import median_seconds, synchronize

    batch, length, repeats = SCORING_SIZES["rehearsal" if rehearse else "gpu"]
    device_name, figures = device(rehearse), {}
    for variant in INFERENCE_VARIANTS:
        model, ids = preset_model(variant, rehearse, batch, length)
        model.eval()

        def score():
            output = model(ids)
            synchronize(device_name)
            return output

        with torch.no_grad(), torch.autocast(device_name, dtype=torch.bfloat16):
            started = time.perf_counter()
            output = score()
            figures[f"{variant} first call s"] = round(time.perf_counter() - started, 2)
            seconds = median_seconds(score, repeats, warmup=0)
        figures[f"{variant} tokens/s"] = round(batch * length / seconds)
        if model.config.implicit:
            figures[f"{variant} solver passes"] = int(output.fixed_point.evaluations)
        print(f"{variant}: {seconds:.3f} s per forward of {batch} x {length} tokens", flush=True)
        report_figures(figures)
        del model, output
    figures["implicit / explicit time"] = round(figures["explicit tokens/s"] / figures["bounded tokens/s"], 2)
    report_figures(figures)


# ---------------------------------------------------------------- step: words

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


def words_step(rehearse: bool, limit_s: float) -> None:
    """Train (stopped by SIGTERM when its share of the time is up: the trainer checkpoints on
    it), then accuracy by length and the passes of hard and easy tokens, through the
    command line."""
    from implicitlm.cli import main

    size = WORDS["rehearsal" if rehearse else "gpu"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-words-") as folder:
        run = Path(folder) / "run"
        figures = train_words(run, size, WORDS_TRAIN_SHARE * limit_s)
        report_figures(figures)
        evaluation = ["--task", "words", str(run), "--max-iter", str(size["max_iter"]), "--no-progress"]
        if main(["eval", "length", *evaluation, "--lengths", size["test_lengths"], "--count", str(size["count"]),
                 "--chunk-length", "0", "--out", f"{folder}/length"]) != 0:
            raise SystemExit("eval length failed")
        figures |= record_metrics(Path(folder) / "length" / "word_length.json", r"accuracy")
        report_figures(figures)
        if main(["eval", "convergence", *evaluation, "--lengths", str(size["length"]),
                 "--count", str(size["convergence_count"]), "--out", f"{folder}/convergence"]) != 0:
            raise SystemExit("eval convergence failed")
        figures |= record_metrics(Path(folder) / "convergence" / "convergence.json",
                                  r"(hard|easy) passes_mean|all share_unconverged|hard token share")
        report_figures(figures)


def train_words(run: Path, size: dict[str, Any], limit_s: float) -> dict[str, Any]:
    train = dict(group="A5xM", hard_prob=0.9, sequence_length=size["length"], batch_size=size["batch"],
                 total_steps=size["steps"], warmup_steps=min(20, size["steps"]), lr=1e-3, bounded_fraction=0,
                 free_max_iter=32, free_phantom_steps=4, free_tol=0.05, checkpoint_every=0, log_every=5)
    options = [f"--train={key}={value}" for key, value in train.items()] + [f"--model={m}" for m in size["model"]]
    command = [sys.executable, "-m", "implicitlm", "words", "train", "--preset", "words_a5", "--out", str(run),
               "--no-progress", *options]
    process = subprocess.Popen(command)
    try:
        code = process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        code = process.wait()
    if code not in (0, 128 + signal.SIGTERM):
        raise SystemExit(f"words train failed (exit code {code})")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {"train steps (last logged)": last["step"] + 1, "stopped by the time limit": code != 0,
            "train tokens/s": round(last["tokens_per_s"]), "train loss": last["loss"], "train accuracy": last["accuracy"],
            "train solver passes": last.get("fp_passes_mean")}


def record_metrics(path: Path, pattern: str) -> dict[str, Any]:
    metrics = json.loads(path.read_text())["metrics"]
    return {key: value for key, value in metrics.items() if re.match(pattern, key)}


# ---------------------------------------------------------------- --prepare: the wheels

# What the GPU image lacks (torchdeq, datasets and those of its dependencies it lacks) or has
# outside our ranges (transformers 5.17 < 5.23), at the versions and hashes of requirements.lock.
# The image's tokenizers 0.23.2 and huggingface_hub 1.33.0 are inside transformers' ranges.
TRAVELLING = ["torchdeq", "transformers", "datasets", "dill", "multiprocess", "xxhash"]
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--only-binary=:all:"]
WHEELS_LIMIT_MIB = 40  # the working tree that travels to the GPU machine is limited to 64 MiB


def prepare() -> None:
    with staged_directory(WHEELS) as staging:
        download_locked(staging)
        build_kernels(staging)
        for wheel in sorted(staging.glob("*.whl")):
            retag_if_pure(wheel)
        check_installable(staging)
    sizes = {wheel.name: wheel.stat().st_size for wheel in sorted(WHEELS.glob("*.whl"))}
    print("\n".join(f"{size / 2**20:7.2f} MiB  {name}" for name, size in sizes.items()))
    print(f"{sum(sizes.values()) / 2**20:7.2f} MiB in {WHEELS.relative_to(ROOT)}/")


def download_locked(folder: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write(locked_entries(ROOT / "requirements.lock", TRAVELLING))
        requirements.flush()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", *PLATFORM,
                        "-d", str(folder), "-r", requirements.name], check=True)


def locked_entries(lock: Path, names: list[str]) -> str:
    """The lock's entries (``name==version`` and its ``--hash`` lines) of ``names``."""
    entries = re.finditer(r"^([A-Za-z0-9._-]+)==\S+ \\\n(?:[ \t]+.*\n)*", lock.read_text(), flags=re.MULTILINE)
    found = {canonical(entry.group(1)): entry.group(0) for entry in entries}
    missing = sorted({canonical(name) for name in names} - set(found))
    if missing:
        raise SystemExit(f"{lock.name} has no entry for {', '.join(missing)}")
    return "".join(found[canonical(name)] for name in names)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_kernels(folder: Path) -> None:
    """mamba-ssm from its locked sdist, without its CUDA extension (its Triton kernels are all
    the library uses), as scripts/kernels.sh installs it here."""
    env = dict(os.environ, MAMBA_SKIP_CUDA_BUILD="TRUE", MAMBA_FORCE_BUILD="TRUE")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--require-hashes",
                    "-r", str(ROOT / "requirements-kernels.lock"), "-w", str(folder)], check=True, env=env)


def retag_if_pure(wheel: Path) -> None:
    """A wheel built here is tagged for this interpreter (cp311): if it holds no compiled
    code, it is retagged py3-none-any, which the GPU's Python 3.12 installs."""
    import zipfile

    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    platforms = [PLATFORM[i + 1] for i, option in enumerate(PLATFORM) if option == "--platform"]
    supported = {*cpython_tags((3, 12), platforms=platforms), *compatible_tags((3, 12), platforms=platforms)}
    if parse_wheel_filename(wheel.name)[3] & supported:
        return
    with zipfile.ZipFile(wheel) as archive:
        compiled = [name for name in archive.namelist() if name.endswith((".so", ".pyd"))]
    if compiled:
        raise SystemExit(f"{wheel.name} holds compiled code ({compiled[0]}) for another Python than 3.12")
    subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", "--python-tag", "py3", "--abi-tag", "none",
                    "--platform-tag", "any", str(wheel)], check=True)


def check_installable(folder: Path) -> None:
    """pip's own verdict that every wheel installs on the GPU's Python 3.12, and their size."""
    wheels = sorted(folder.glob("*.whl"))
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-index", "--no-deps",
                        "--target", target, *PLATFORM, *map(str, wheels)], check=True)
    total = sum(wheel.stat().st_size for wheel in wheels)
    if total > WHEELS_LIMIT_MIB * 2**20:
        raise SystemExit(f"the wheels take {total / 2**20:.1f} MiB, more than {WHEELS_LIMIT_MIB} MiB")


# ---------------------------------------------------------------- command line

STEP_FUNCTIONS = {"setup": setup_step, "kernel": kernel_step, "training": training_step_figures,
                  "decoding": decoding_figures, "scoring": scoring_figures, "words": words_step}


def pytest_runtest_logreport(report) -> None:
    """The tests step loads this file as a pytest plugin: a failure's message goes to the log
    when it happens. pytest prints it in its closing summary, which a step stopped at its
    limit never reaches (on the H200 a failure's reason was lost that way)."""
    if report.failed:
        print(f"\n----- {report.nodeid} ({report.when}) failed:\n{report.longreprtext}\n", flush=True)


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
    parser.add_argument("--step", choices=STEP_FUNCTIONS, help=argparse.SUPPRESS)  # one step, in its own process
    parser.add_argument("--limit", type=positive_seconds, default=DEFAULT_BUDGET_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        STEP_FUNCTIONS[args.step](args.rehearse, args.limit)
        return 0
    if args.prepare:
        prepare()
        return 0
    out = args.out or Path(os.environ.get("OUT") or DEFAULT_OUT)
    return run_all(out.absolute(), args.rehearse, args.budget)


if __name__ == "__main__":
    sys.exit(main())
