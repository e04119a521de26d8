"""The GPU check's tests step: the ``device``-marked tests on cuda, the files nearest the 130M
path first, through pytest in a process of its own; this file is also its pytest plugin, and
reads its counts back for the report."""

from __future__ import annotations

import re
import sys
from typing import Any

from gpu_check_shared import ROOT

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


def tests_command(rehearse: bool) -> list[str]:
    # Not named pytest_*: pytest takes every such name in a plugin for a hook of its own.
    # -v: a line per test, so a run cut off by its limit still says how far it got;
    # --durations: where the time went (the first calls compile and autotune the kernels);
    # a file that imports what the GPU machine lacks is reported, the others still run.
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-v", "-rfE", "--tb=short", "--durations=5",
               "-p", "no:cacheprovider", "--continue-on-collection-errors", "-m", "device", *TEST_FILES]
    command += ["-p", "gpu_check_tests"]  # this file, for pytest_runtest_logreport below
    return command + ["-k", REHEARSED_TESTS] if rehearse else command


def pytest_runtest_logreport(report) -> None:
    """The tests step loads this file as a pytest plugin: a failure's message goes to the log
    when it happens. pytest prints it in its closing summary, which a step stopped at its
    limit never reaches (on the H200 a failure's reason was lost that way)."""
    if report.failed:
        print(f"\n----- {report.nodeid} ({report.when}) failed:\n{report.longreprtext}\n", flush=True)


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
