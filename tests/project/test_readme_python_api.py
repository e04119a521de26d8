"""The README's "Python API" section, block by block, as a user would paste it: the blocks run
in order in one namespace, in a fresh folder, and their results are checked."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def python_api_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_readme_python_api_blocks_run_and_do_what_they_say(tmp_path, monkeypatch):
    blocks = python_api_blocks()
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md: words", "exec"), namespace)
    rows = namespace["result"]["rows"]
    assert [row["length"] for row in rows] == [12, 24, 48]
    assert rows[0]["accuracy_last10"] > 0.95 and all("fp_not_converged_share" in row for row in rows)
    accuracy, agreement = map(float, printed.getvalue().split()[-2:])
    assert accuracy > 0.9 and agreement > 0.95, "the RNN must give the parallel solve's answers"
    assert (tmp_path / "runs" / "s3" / "checkpoints" / "step_0000180").is_dir()

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[1], "README.md: language model", "exec"), namespace)
    rows = namespace["result"]["rows"]
    assert [row["length"] for row in rows] == [128, 256]
    # Better than guessing among the vocabulary, and every held-out window scored.
    assert all(math.isfinite(row["perplexity"]) and row["perplexity"] < len(namespace["tokenizer"]) / 4 for row in rows)
    assert printed.getvalue().strip().splitlines()[-1].startswith("def load(")
