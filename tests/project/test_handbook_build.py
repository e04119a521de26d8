"""The handbook (mkdocs.yml, docs/) builds in strict mode: a broken link or anchor, a stale
API reference, or a generated section that no longer renders fails the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    # Material prints a banner about MkDocs 2 on every build; it is not a warning of ours.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_the_handbook_builds_strictly_with_the_generated_references(tmp_path):
    done = build(tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    # Every command's --help is there, from the parser: the deepest ones included.
    for command in ("implicitlm words train", "implicitlm eval budget", "implicitlm models import", "implicitlm lm downstream"):
        assert command in cli, command
    assert "--chunk-length" in cli and "--overwrite" in cli
    options = (tmp_path / "site" / "reference" / "options" / "index.html").read_text()
    for key in ("bounded_max_iter", "free_max_iter", "train_max_iter", "chunk_length", "num_attention_heads", "time_step_rank"):
        assert f"<code>{key}</code>" in options, key
    api = (tmp_path / "site" / "reference" / "api" / "models" / "index.html").read_text()
    assert "config_from_options" in api and "load_model" in api


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\ndocs_dir: docs\n")
    done = build(tmp_path / "site", config)
    assert done.returncode != 0 and "guide.md" in done.stderr
