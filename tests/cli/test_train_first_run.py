"""What a first training run shows: a refusal for memory before anything is built, the
held-out perplexity as it is evaluated, plain progress lines without bars, a readable
summary, and errors that name the flags of the command line."""

from __future__ import annotations

import pytest
import torch

import implicitlm.core.memory
import implicitlm.train.runs
from implicitlm.cli import main
from tests.support.refusals import printed_error_line

MACHINE = 22 * 2**30  # the machine the refusal was first seen on


@pytest.fixture
def twenty_two_gib(monkeypatch):
    monkeypatch.setattr(implicitlm.core.memory, "available_bytes", lambda device=None: MACHINE)

    def never(*args, **kwargs):
        raise AssertionError("the model was built before its memory was estimated")

    monkeypatch.setattr(implicitlm.train.runs, "build_model", never)


def test_the_default_lm_run_is_refused_up_front_with_a_preset_that_fits(shards, tmp_path, capsys, twenty_two_gib):
    assert main(["train", "--data", str(shards), "--out", str(tmp_path / "run")]) == 2
    line = printed_error_line(capsys)
    # 24 blocks of 768 at 8 x 2048 tokens, 4 phantom passes: hundreds of GiB, not the 22 the kernel allowed.
    assert "8 x 2048 tokens per batch (4 pass(es) kept for the gradient) needs about" in line
    assert "GiB of memory; 22.0 GiB is available; a smaller model: --config lm_wikitext2 (about" in line
    assert not (tmp_path / "run").exists()


def test_the_default_words_run_is_refused_up_front_with_a_preset_that_fits(tmp_path, capsys, twenty_two_gib):
    assert main(["words", "train", "--out", str(tmp_path / "run")]) == 2
    line = printed_error_line(capsys)
    assert "128 x 16 tokens per batch" in line and "22.0 GiB is available" in line
    assert "a smaller model: --preset words_s5 (about" in line


def test_from_python_the_refusal_names_the_argument(shards, tmp_path, twenty_two_gib):
    with pytest.raises(ValueError, match=r"22.0 GiB is available; a smaller model: preset=lm_wikitext2 \(about"):
        implicitlm.train.runs.train_lm_run(shards, tmp_path / "run")


@pytest.mark.slow
def test_a_run_without_bars_prints_steps_held_out_perplexity_and_a_summary(shards, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--data", str(shards), "--out", str(run), "--config", "lm_demo", "--no-progress",
                 "--model", "hidden_size=16", "--model", "head_dim=8", "--model", "state_size=8", "--model", "num_hidden_layers=1",
                 "--train", "total_steps=4", "--train", "log_every=2", "--train", "eval_every=2", "--train", "eval_batches=1",
                 "--train", "sequence_length=32", "--train", "batch_size=2", "--train", "batch_tokens=0"])
    assert code == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert [line.split(":")[0] for line in out[:-4]] == ["step 1/4", "step 2", "step 3/4", "step 4/4", "step 4"]
    held_out = [line for line in out[:-4] if "held-out" in line]
    assert len(held_out) == 2 and all("perplexity" in line for line in held_out)
    assert out[-4] == f"device: {'cuda' if torch.cuda.is_available() else 'cpu'}"
    out = out[-3:]
    assert out[0].startswith("trained 4 steps, 256 tokens in ") and "final loss" in out[0] and "(perplexity" in out[0]
    assert out[1].startswith("held-out perplexity ") and held_out[-1].endswith(out[1].split()[2])
    assert out[2] == f"checkpoints: {run / 'checkpoints'} (latest: {run / 'checkpoints' / 'step_0000004'})"
    assert "{" not in captured.out and captured.err == ""


def test_missing_shards_name_the_command_that_builds_them(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "run")]) == 2
    assert "build the shards with `implicitlm corpus build`" in printed_error_line(capsys)
