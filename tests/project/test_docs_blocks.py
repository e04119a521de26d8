"""Every fenced code block of the README and of the handbook's pages (``docs/**/*.md``) runs as a
user would paste it: each block on its own, twice in a row, in a fresh folder (so it must also
be rerunnable). ``python`` blocks run with this interpreter; ``bash``, ``sh`` and ``console``
blocks run as shell scripts with this interpreter's ``bin/`` (the venv's ``implicitlm``) first on
PATH. A block that cannot run on a small CPU in seconds is marked by ``<!-- not run: reason -->``
on the line before it; output, synopses with placeholders and data are fenced as ``text``,
``json`` or ``yaml``. A block that is neither run nor marked fails the suite, and so does a run
block's output that misses what ``<!-- prints: REGEX -->`` (on the line after it) says it prints.
A block not run is still checked: each of its commands is parsed by the parser that would run
it, and the presets, option keys, scripts and tasks it names must exist
(``tests.support.documented_commands``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.documented_commands import check_block

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
RUN_AS = {"python": "python", "bash": "shell", "sh": "shell", "console": "shell"}
NOT_CODE = {"text", "json", "yaml"}
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+\S) -->$")
PRINTS = re.compile(r"^<!-- prints: (.+\S) -->$")
README_LINES = 300
QUICKSTART_LINES = 40
# Seconds one run of one block may take (the slowest take about 20 s on 2 CPU cores).
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: str | None
    prints: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks (fences at the start of a line), each with the reason it is not
    run (the line before it) and what it prints (the line after it)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, start = [], None
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if not fence:
            continue
        if start is None:
            start, language = number, fence.group(1)
            continue
        before = NOT_RUN.match(lines[start - 1]) if start else None
        after = PRINTS.match(lines[number + 1]) if number + 1 < len(lines) else None
        code = "\n".join(lines[start + 1:number]) + "\n"
        blocks.append(Block(page, start + 1, language, code, before and before.group(1), after and after.group(1)))
        start = None
    assert start is None, f"{page.relative_to(ROOT)}:{start + 1}: a fence that is never closed"
    return blocks


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
RUN = [block for block in BLOCKS if block.language in RUN_AS and block.not_run is None]
NOT_RUN_BLOCKS = [block for block in BLOCKS if block.language in RUN_AS and block.not_run is not None]


def test_every_block_is_run_or_marked_as_not_run():
    unknown = [block.name for block in BLOCKS if block.language not in RUN_AS and block.language not in NOT_CODE]
    assert not unknown, f"blocks neither run nor marked (fence them as {sorted(RUN_AS)} or {sorted(NOT_CODE)}): {unknown}"
    misplaced = [block.name for block in BLOCKS if block.prints and block not in RUN]
    assert not misplaced, f"'prints' after a block that does not run: {misplaced}"
    # The README and the guides show what a user runs first: blocks that run.
    assert len(RUN) >= 8
    assert {block.page.name for block in RUN} >= {"README.md", "word-problems.md", "language-model.md", "evaluation.md"}


def test_the_readme_is_short_and_its_quickstart_fits_forty_lines():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES
    quickstart = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0].strip("\n").splitlines()
    shown = [line for line in quickstart if not line.startswith("<!-- ")]  # the markers are not shown
    assert len(shown) <= QUICKSTART_LINES
    assert {block.language for block in RUN if block.page == README} == {"bash", "python"}


def test_the_readme_links_name_files_that_exist():
    # mkdocs checks the handbook's links; the README is outside it.
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    missing = [target for target in targets if "://" not in target and not (ROOT / target).exists()]
    assert targets and not missing, missing


@pytest.mark.parametrize("block", NOT_RUN_BLOCKS, ids=[block.name for block in NOT_RUN_BLOCKS])
def test_a_block_not_run_names_commands_flags_and_presets_that_exist(block):
    assert RUN_AS[block.language] == "shell", f"{block.name}: a python block that does not run checks nothing"
    problems = check_block(block.code)
    assert not problems, f"{block.name}:\n" + "\n".join(problems)


def test_the_check_of_blocks_not_run_refuses_stale_commands():
    stale = {
        "implicitlm train --data d --out r --config lm_wikitex2": "lm_wikitex2",
        "implicitlm words train --preset demo --out s3 --train bounded_iters=4": "bounded_iters",
        "implicitlm words train --preset demo --out s3 --model hiden_size=8": "hiden_size",
        "implicitlm eval budget --task words RUN --budgets 1,2": "--budgets",
        "torchrun --nproc_per_node 2 -m implicitlm words budget RUN": "invalid choice",
        "implicitlm-lm-eval --model implicitlm --model_args pretrained=R --tasks piqa_locl": "piqa_locl",
        "bash scripts/no-such.sh": "no script",
        "python benchmarks/run.py --only mixr": "mixr",
        "W=x\nimplicitlm words eval $W --lenghts 8": "--lenghts",
        "pip install implicitlm": "no check",
    }
    for code, named in stale.items():
        problems = check_block(code.replace("\\n", "\n"))
        assert len(problems) == 1 and named in problems[0], (code, problems)
    assert check_block("W=s3/free\nimplicitlm words eval $W --multiples 1,2 \\\n  --count 8   # a comment\n") == []


def run_block(block: Block, folder: Path, script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if RUN_AS[block.language] == "python":
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, str(script)]
    else:
        code = block.code
        if block.language == "console":  # the commands after "$ "; the rest is their output
            code = "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))
        script.write_text(code, encoding="utf-8")
        command = ["bash", "-euo", "pipefail", str(script)]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[block.name for block in RUN])
def test_the_block_runs_twice_in_a_fresh_folder(block, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    for attempt in ("first", "second"):
        done = run_block(block, folder, tmp_path / "block")
        assert done.returncode == 0, f"{block.name}, {attempt} run, exit {done.returncode}:\n{done.stderr[-3000:]}"
        if block.prints:
            assert re.search(block.prints, done.stdout, flags=re.MULTILINE), f"{block.name}: {done.stdout[-2000:]}"


# The install block's lines whose time the pages state, and the command each runs after its setup,
# as benchmarks/RESULTS.md records its CPU time ("| `COMMAND` ... | N s |"; a command's first row
# is its time, a later one the same command under other conditions).
TIMED = {"bash scripts/demo.sh ": "implicitlm demo --out DIR", 'bash scripts/test.sh -m "not slow" ': 'pytest -m "not slow"'}
STATED = re.compile(r"(\d+) CPU-minutes")


def recorded_cpu_seconds() -> list[tuple[str, float]]:
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| ([\d,]+) s \|", RESULTS.read_text(encoding="utf-8"), re.MULTILINE)
    return [(command, float(seconds.replace(",", ""))) for command, seconds in rows if command in TIMED.values()]


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "getting-started.md"], ids=lambda page: page.name)
def test_the_stated_times_are_the_measured_cpu_times(page):
    """Before: "~5 min" and "about a minute", wall times of a quiet machine; beside other work the
    demo took 45 minutes and the quick tests 18 (722 CPU-seconds). CPU time stated as measured,
    and the reader sent to the progress line's estimate."""
    first = {}
    for command, seconds in recorded_cpu_seconds():
        first.setdefault(command, seconds)
    assert set(first) == set(TIMED.values()), first
    text = page.read_text(encoding="utf-8")
    for start, command in TIMED.items():
        [line] = [line for line in text.splitlines() if line.startswith(start)]
        assert STATED.findall(line) == [str(round(first[command] / 60))], line
    assert not re.search(r"~\d+ min|about a minute", text)
    assert "progress line" in " ".join(text.split())  # the estimate to trust, named


def test_every_cpu_time_a_page_states_is_one_measured():
    measured = {round(seconds / 60) for _, seconds in recorded_cpu_seconds()}
    stated = {page.name: {int(n) for n in STATED.findall(page.read_text(encoding="utf-8"))} for page in PAGES}
    assert all(minutes <= measured for minutes in stated.values()) and stated["README.md"], stated


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "getting-started.md"], ids=lambda page: page.name)
def test_the_setup_activates_the_venv_before_the_first_implicitlm_command(page):
    """After the setup block (scripts/demo.sh installs .venv, not onto PATH), a pasted
    ``implicitlm`` command is not found unless the page has the reader activate the venv first."""
    blocks = [block for block in fenced_blocks(page) if block.language in RUN_AS]
    first = next(i for i, block in enumerate(blocks) if re.search(r"^\s*implicitlm\b", block.code, re.MULTILINE))
    assert any("source .venv/bin/activate" in block.code for block in blocks[:first]), page.name
    assert check_block("source .venv/bin/activate") == []
    assert check_block("source other/bin/activate") != []
