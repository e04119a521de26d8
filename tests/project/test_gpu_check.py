"""The GPU check rehearsed on the CPU: the one command a GPU at hand for minutes runs must not
spend them on a typo. Every step of ``scripts/gpu-check.sh --rehearse`` (tiny shapes, Triton's
interpreter for the fused kernel) runs, ends ok and reports finite key figures, in an output
folder of at most 8 files, which a remote machine returning a few files returns whole."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_decoding  # noqa: E402
import gpu_check_kernel  # noqa: E402
import gpu_check_setup  # noqa: E402
import gpu_check_shared  # noqa: E402
import gpu_check_tests  # noqa: E402
import gpu_check_training  # noqa: E402
import gpu_check_wheels  # noqa: E402

pytestmark = pytest.mark.slow

# The files a remote GPU machine returns of an output folder, at most.
MOST_FILES = 8


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gpu-check")
    finished = subprocess.run(["bash", "scripts/gpu-check.sh", "--rehearse", "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "| step | status |" in finished.stdout  # the report, printed last for whoever ran it
    return out, json.loads((out / "summary.json").read_text())


def test_every_step_runs_and_ends_ok(rehearsal):
    out, summary = rehearsal
    assert summary["complete"]
    assert [step["step"] for step in summary["steps"]] == [step.name for step in gpu_check.STEPS]
    for step in summary["steps"]:
        assert step["status"] == "ok", (step, (out / step["log"]).read_text()[-3000:])
        assert step["figures"], step["step"]
        assert 0 < step["seconds"] <= step["limit_s"]
    report = (out / "report.md").read_text()
    assert all(f"| {step.name} | ok |" in report for step in gpu_check.STEPS)


def test_only_the_steps_that_time_training_decoding_and_scoring_tune_the_kernels(monkeypatch, rehearsal):
    from implicitlm.layers.ssd_kernel import KERNEL_TUNING

    monkeypatch.delenv(KERNEL_TUNING, raising=False)
    untuned = {"kernel", "tests", "words", "benchmarks"}
    for step in gpu_check.STEPS:
        tuning = gpu_check.step_environment(step.name, rehearse=False).get(KERNEL_TUNING)
        assert tuning == ("smallest" if step.name in untuned else None), step.name
    _, summary = rehearsal
    said = {step["step"] for step in summary["steps"] if "untuned" in step["figures"].get("kernels", "")}
    assert said == untuned  # the report says which figures came from untuned kernels


def test_the_output_folder_is_flat_and_small_enough_to_come_back_whole(rehearsal):
    out, _ = rehearsal
    entries = list(out.iterdir())
    assert all(entry.is_file() for entry in entries) and len(entries) <= MOST_FILES


def test_key_figures_are_present_and_finite(rehearsal):
    _, summary = rehearsal
    figures = {step["step"]: step["figures"] for step in summary["steps"]}
    numbers = [value for step in figures.values() for value in step.values() if isinstance(value, (int, float))]
    assert all(math.isfinite(value) for value in numbers)
    assert figures["tests"]["passed"] > 0 and "failed" not in figures["tests"]
    kernel = figures["kernel"]
    assert kernel["checks"] == len(gpu_check_kernel.KERNEL_QUANTITIES) and kernel["failed"] == 0
    assert kernel["float32 max rel err"] < gpu_check_kernel.KERNEL_THRESHOLDS["float32"]
    assert kernel["oracle vs recurrence"] < 1e-12
    assert figures["benchmarks"]["tables"] == 1
    for variant in gpu_check_training.TRAINING_VARIANTS:
        assert figures["training"][f"{variant} tokens/s"] > 0
    assert figures["training"]["free solver passes"] > figures["training"]["bounded solver passes"] == 4
    assert all(figures["training"][f"{variant} first step s"] > 0 for variant in gpu_check_training.TRAINING_VARIANTS)
    decoding, scoring = figures["decoding"], figures["scoring"]
    for graphed in ("", " graphed"):
        for passes in gpu_check_decoding.DECODING_PASSES:
            assert decoding[f"130M bounded {passes} passes{graphed} ms/token"] > decoding[f"130M explicit{graphed} ms/token"] > 0
            assert decoding[f"130M implicit / ({passes} x explicit){graphed}"] > 0
    assert scoring["explicit tokens/s"] > 0 and scoring["bounded tokens/s"] > 0 and scoring["bounded solver passes"] >= 1
    assert scoring["implicit / explicit time"] > 0
    words = figures["words"]
    assert 0 <= words["accuracy_last10@8"] <= 1 and words["hard token share"] > 0
    assert {"hard passes_mean", "easy passes_mean", "all share_unconverged"} <= set(words)


def test_a_step_past_its_limit_is_stopped_and_reported_without_losing_the_others(tmp_path, monkeypatch):
    """The budget's guard: a step that overruns is ended (its process group), marked "timed
    out", and what it printed before is still read."""
    script = tmp_path / "slow.py"
    script.write_text(f"print({gpu_check_shared.FIGURES!r} + '{{\"first\": 1}}', flush=True)\nimport time\ntime.sleep(60)\n")
    monkeypatch.setattr(gpu_check, "step_command", lambda name, rehearse, limit: [sys.executable, str(script)])
    monkeypatch.setattr(gpu_check, "MINIMUM_STEP_S", 1.0)
    result = gpu_check.run_step(gpu_check.Step("slow", "slow.log", 3.0), 3.0, tmp_path, rehearse=True)
    assert result.status == "timed out" and result.figures == {"first": 1}
    assert result.seconds < 20
    assert gpu_check.run_step(gpu_check.Step("late", "late.log", 0.5), 0.5, tmp_path, rehearse=True).status == "skipped"


def test_the_steps_end_within_the_budget_in_order_of_value_and_the_tests_get_what_the_others_leave():
    names = [step.name for step in gpu_check.STEPS]
    # The 130M figures first: the tests' many small shapes each cost a tuning. Decoding tunes no
    # kernel (its prompt is read token by token), scoring reads the shapes training tuned.
    assert names.index("decoding") < names.index("training") < names.index("scoring") < names.index("tests")
    assert names.index("kernel") < names.index("tests") < names.index("words")
    budget = gpu_check.DEFAULT_BUDGET_S
    # Every step using its whole limit still ends the check within the budget.
    left = budget
    for index, step in enumerate(gpu_check.STEPS):
        left -= gpu_check.step_limit(step, gpu_check.STEPS[index + 1:], left)
    assert left >= 0
    # Time the steps before them leave goes to the tests, the limits of the steps after them kept.
    tests = names.index("tests")
    after = gpu_check.STEPS[tests + 1:]
    assert gpu_check.step_limit(gpu_check.STEPS[tests], after, 300.0) == 300.0 - sum(s.limit_s for s in after)
    assert gpu_check.step_limit(gpu_check.STEPS[tests], after, 50.0) == 0.0


def test_every_step_shares_one_triton_cache_folder_with_its_tuning_kept(monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    for rehearse in (False, True):
        environments = [gpu_check.step_environment(step.name, rehearse) for step in gpu_check.STEPS]
        assert {env["TRITON_CACHE_DIR"] for env in environments} == {str(gpu_check.TRITON_CACHE)}
        assert {env["TRITON_CACHE_AUTOTUNING"] for env in environments} == {"1"}
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")  # the user's own folder stands
    assert gpu_check.step_environment("kernel", False)["TRITON_CACHE_DIR"] == "/somewhere/else"


def test_every_step_this_file_runs_has_a_module_with_its_run():
    """``--step NAME`` runs gpu_check_NAME.py: each such step of the check imports and has its ``run``."""
    names = [step.name for step in gpu_check.STEPS]
    assert set(gpu_check.STEP_MODULES) == set(names) - {"tests", "benchmarks"}
    for name in gpu_check.STEP_MODULES:
        assert callable(importlib.import_module(f"gpu_check_{name}").run), name


def test_the_installed_mamba_ssm_keeps_its_version_and_not_its_cuda_extension_import(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text('__version__ = "2.3.2.post1"\n\nimport selective_scan_cuda\nfrom mamba_ssm.ops import x\n')
    gpu_check_setup.without_cuda_extension_import(init)
    lines = init.read_text().splitlines()
    assert lines[1:] == ['__version__ = "2.3.2.post1"'] and lines[0].startswith("# Emptied by")


def test_a_gpu_machine_without_the_wheels_is_told_to_prepare_them(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check_setup, "WHEELS", tmp_path)
    with pytest.raises(SystemExit, match="no wheels in .*scripts/gpu-check.sh --prepare"):
        gpu_check_setup.install_wheels()


def test_unmet_requirements_are_the_missing_and_those_outside_their_range():
    pytest_version = metadata.version("pytest")
    requirements = ["torch>=1", "no-such-package-here>=1", "pytest<1", 'no-such-package-either; python_version < "3"']
    assert gpu_check_setup.unmet(requirements) == ["no-such-package-here missing", f"pytest {pytest_version}, not <1"]


def test_the_travelling_wheels_are_taken_from_the_lock_with_their_hashes(tmp_path):
    entries = gpu_check_wheels.locked_entries(ROOT / "requirements.lock", gpu_check_wheels.TRAVELLING)
    names = re.findall(r"^([A-Za-z0-9._-]+)==", entries, flags=re.MULTILINE)
    assert names == gpu_check_wheels.TRAVELLING
    assert entries.count("--hash=sha256:") >= len(names)
    with pytest.raises(SystemExit, match="requirements.lock has no entry for no-such-wheel"):
        gpu_check_wheels.locked_entries(ROOT / "requirements.lock", ["torchdeq", "No_Such.Wheel"])


def test_the_tests_step_counts_from_pytests_summary_or_from_a_run_cut_off_before_it():
    finished = ("tests/a.py::test_one PASSED\ntests/a.py::test_two FAILED\n"
                "FAILED tests/a.py::test_two - AssertionError\n"
                "===== 1 failed, 1 passed, 2 skipped, 3 deselected, 1 error in 9.10s =====\n")
    assert gpu_check_tests.read_pytest(finished) == {"failed": 1, "passed": 1, "skipped": 2, "deselected": 3,
                                                     "error": 1, "failed tests": ["tests/a.py::test_two"]}
    cut_off = "tests/a.py::test_one PASSED\ntests/a.py::test_two PASSED\ntests/b.py::test_three SKIPPED\n"
    assert gpu_check_tests.read_pytest(cut_off) == {"passed": 2, "skipped": 1, "cut off after": 3}
