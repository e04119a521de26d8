"""A resume continues the run it finds, or refuses in one line and changes nothing.

A checkpoint's step is said four times: in its folder's name, in trainer.json, in the
scheduler's state and in the optimiser's per-parameter step counts. A resume goes on only
where all four agree; and a checkpoint that cannot be written (a full disk) ends the run in
one line with the previous checkpoint intact. The learning-rate floor may not lie above the
peak.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from implicitlm.cli import main
from implicitlm.core.errors import DataError, OptionError
from implicitlm.core.json_file import parse_json, read_json_object
from implicitlm.core.run_folder import latest_checkpoint, read_trainer_meta
from implicitlm.data.corpus import read_documents
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.tokenizer import load_tokenizer
from implicitlm.models import load_model
from implicitlm.train.config import TrainConfig

MODEL = ["hidden_size=16", "num_hidden_layers=1", "state_size=8", "head_dim=8", "chunk_size=16"]
SETTINGS = ["group=S3", "sequence_length=6", "batch_size=8", "lr=0.01", "warmup_steps=2", "log_every=1",
            "bounded_fraction=1.0", "checkpoint_every=2", "keep_checkpoints=3"]


def words_train(out: Path, *settings: str, resume: bool = False) -> list[str]:
    options = [] if resume else [arg for option in MODEL for arg in ("--model", option)]
    train = [arg for setting in (*([] if resume else SETTINGS), *settings) for arg in ("--train", setting)]
    return ["words", "train", "--out", str(out), "--no-progress", *(["--resume"] if resume else []), *options, *train]


def resume(out: Path, *settings: str) -> list[str]:
    return words_train(out, *settings, resume=True)


def run_bytes(run: Path) -> dict[str, bytes]:
    """Every file of a run's checkpoints and its training log, by path."""
    files = [*sorted((run / "checkpoints").rglob("*")), run / "metrics.jsonl"]
    return {str(path.relative_to(run)): path.read_bytes() for path in files if path.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished word run of 6 steps with checkpoints after steps 2, 4 and 6."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(words_train(out, "total_steps=6")) == 0
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    # Its links kept: a copy that followed them holds step 6's files in latest/, which an edit
    # of step 6 would leave a copy of no checkpoint, refused before the edit is seen.
    shutil.copytree(finished, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


STEP_6 = Path("checkpoints/step_0000006")
STATE = "training_state.pt"


def set_step(step: int):
    def edit(checkpoint: Path) -> None:
        (checkpoint / "trainer.json").write_text(json.dumps({**read_trainer_meta(checkpoint), "step": step}))
    return edit


def duplicate_step(checkpoint: Path) -> None:
    meta = checkpoint / "trainer.json"
    meta.write_text(meta.read_text().replace('"step": 6', '"step": 6, "step": 2'))


def copy_in_step_4s_state(checkpoint: Path) -> None:
    shutil.copyfile(checkpoint.parent / "step_0000004" / STATE, checkpoint / STATE)


def set_optimiser_steps_to_5(checkpoint: Path) -> None:
    state = torch.load(checkpoint / STATE, weights_only=True)
    for parameter in state["optimizer"]["state"].values():
        parameter["step"] = torch.tensor(5.0)
    torch.save(state, checkpoint / STATE)


TAMPERED = {
    "lowered-step": (set_step(4), "trainer.json: step 4, but the checkpoint's folder is step_0000006"),
    "duplicate-step": (duplicate_step,
                       "trainer.json: expected JSON (checkpoint metadata): duplicate key 'step'"),
    "huge-step": (set_step(10**30), f"trainer.json: step {10**30}, but the checkpoint's folder is step_0000006"),
    "text-step": (set_step("x"), "trainer.json: checkpoint metadata 'step' must be an integer >= 0, got 'x'"),
    "other-steps-state": (copy_in_step_4s_state,
                          "training_state.pt: the scheduler's state is at step 4, but trainer.json says step 6"),
    "optimiser-steps": (set_optimiser_steps_to_5,
                        "training_state.pt: the optimiser's state has taken 5 steps, but trainer.json says step 6"),
}


@pytest.mark.parametrize("tamper", TAMPERED, ids=list(TAMPERED))
def test_a_checkpoint_whose_step_disagrees_is_refused_and_nothing_changes(run, capsys, tamper):
    """before: a lowered step retrained steps 5-6 over step_0000006, a duplicate key two
    checkpoints, 10**30 printed {} and exited 0, another step's training state resumed at the
    wrong learning rate; all with exit 0."""
    change, expected = TAMPERED[tamper]
    change(run / STEP_6)
    before = run_bytes(run)
    capsys.readouterr()
    assert main(resume(run, "total_steps=8")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(run / STEP_6) in err[0] and expected in err[0], err
    assert run_bytes(run) == before


@pytest.mark.parametrize("total_steps", [4, 6])
def test_a_resume_with_no_steps_left_is_refused(run, capsys, total_steps):
    """before: ``--resume --train total_steps=4`` of a run at step 6 printed {}, exited 0 and
    trained nothing."""
    before = run_bytes(run)
    capsys.readouterr()
    assert main(resume(run, f"total_steps={total_steps}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"the run is at step 6 already, and total_steps={total_steps}: nothing to train" in err[0], err
    assert run_bytes(run) == before
    assert main(resume(run, "total_steps=7", "checkpoint_every=1")) == 0
    assert read_trainer_meta(latest_checkpoint(run))["step"] == 7


def test_json_files_with_a_duplicate_key_are_refused_at_any_depth(tmp_path):
    file = tmp_path / "index.json"
    file.write_text('{"shards": {"train": 1, "train": 2}}')
    expected = r"index.json: expected JSON \(a shard index\): duplicate key 'train'"
    with pytest.raises(DataError, match=expected):
        read_json_object(file, "a shard index")
    with pytest.raises(DataError, match=r"docs.jsonl:3: expected a JSON object: duplicate key 'text'"):
        parse_json('{"text": "a", "text": "b"}', "docs.jsonl", "a JSON object", line=3)
    assert parse_json('{"a": {"b": 1}, "b": [{"a": 2}]}', "x.json", "JSON") == {"a": {"b": 1}, "b": [{"a": 2}]}


# ---------------------------------------------------------------- the LM trainer: the same resume


def lm_train(shards: Path, out: Path, *settings: str) -> list[str]:
    return ["train", "--data", str(shards), "--out", str(out), "--no-progress",
            *[arg for setting in settings for arg in ("--train", setting)]]


def test_the_lm_trainer_refuses_a_lowered_step_too(shards, tmp_path, capsys):
    """before: the LM resume trusted trainer.json's step as the word one did."""
    out = tmp_path / "run"
    model = [arg for option in MODEL for arg in ("--model", option)]
    settings = ["sequence_length=16", "batch_size=2", "batch_tokens=0", "total_steps=2", "checkpoint_every=1",
                "warmup_steps=1", "log_every=1"]
    assert main([*lm_train(shards, out, *settings), *model]) == 0
    checkpoint = out / "checkpoints" / "step_0000002"
    set_step(1)(checkpoint)
    before = run_bytes(out)
    capsys.readouterr()
    assert main([*lm_train(shards, out, "total_steps=4"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer.json: step 1, but the checkpoint's folder is step_0000002" in err[0], err
    assert run_bytes(out) == before


# ---------------------------------------------------------------- a full disk, for real


def train_under_file_size_limit(out: Path, limit: int) -> subprocess.CompletedProcess:
    """``words train --resume`` in a process that may write no file beyond ``limit`` bytes:
    its writes fail with EFBIG as on a full disk (SIGXFSZ ignored, so they fail, not kill)."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", "implicitlm", *resume(out, "total_steps=4")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, preexec_fn=limited, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["training_state.pt", "model.safetensors"])
def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_last_one_resumes(tmp_path, failing):
    """before: a failed write of training_state.pt was a 42-line chained RuntimeError traceback."""
    out = tmp_path / "run"
    assert main(words_train(out, "total_steps=2")) == 0
    step_2 = out / "checkpoints" / "step_0000002"
    before = run_bytes(out)
    sizes = {name: (step_2 / name).stat().st_size for name in ("model.safetensors", "training_state.pt")}
    # Small enough to stop the file that should fail, large enough for every smaller file of the run.
    limit = sizes["model.safetensors"] + 1 if failing == "training_state.pt" else sizes["model.safetensors"] // 2
    assert sizes[failing] > limit > 2 * max(len(data) for name, data in before.items() if name.endswith(".json"))
    result = train_under_file_size_limit(out, limit)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(err) == 1, result.stderr[-3000:]
    assert err[0] == (f"implicitlm: error: {out / 'checkpoints' / 'step_0000004'}: could not be written "
                      f"({failing}: File too large); the last checkpoint is {step_2}")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000002"]  # no staging folder left
    assert {name: data for name, data in run_bytes(out).items() if name.startswith("checkpoints")} == {
        name: data for name, data in before.items() if name.startswith("checkpoints")}
    assert load_model(out).num_parameters() > 0
    assert main(resume(out, "total_steps=4")) == 0
    assert latest_checkpoint(out).name == "step_0000004"


# ---------------------------------------------------------------- the learning-rate floor


def test_a_floor_above_the_peak_rate_is_refused_on_the_command_line(tmp_path, capsys):
    """before: ``min_lr=1 decay_fraction=0.5`` trained with the rate rising from 0.01 to 1 in the decay."""
    out = tmp_path / "run"
    assert main(words_train(out, "total_steps=2", "min_lr=1", "decay_fraction=0.5")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["implicitlm: error: min_lr=1 is more than lr=0.01: the decay would raise the rate, not lower it"]
    assert not out.exists()
    lm = ["train", "--data", str(tmp_path / "none"), "--out", str(out)]
    assert main([*lm, "--train", "lr=0.001", "--train", "min_lr=0.002"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "implicitlm: error: min_lr=0.002 is more than lr=0.001: the decay would raise the rate, not lower it"]


@pytest.mark.parametrize("task", ["words", "lm"])
def test_a_floor_above_the_peak_rate_is_refused_in_python(task):
    with pytest.raises(OptionError, match=r"^min_lr=0.5 is more than lr=0.003"):
        TrainConfig.for_task(task, lr=0.003, min_lr=0.5)
    assert TrainConfig.for_task(task, lr=0.003, min_lr=0.003).min_lr == 0.003  # a constant rate is allowed


# ---------------------------------------------------------------- the LM trainer: its own model and data

LM_PRESET = {
    "model": {"architecture": "mamba2", "hidden_size": 16, "num_hidden_layers": 1, "state_size": 8, "head_dim": 8,
              "chunk_size": 16},
    "train": {"sequence_length": 16, "batch_size": 2, "batch_tokens": 0, "total_steps": 2, "checkpoint_every": 1,
              "warmup_steps": 1, "log_every": 1},
}


@pytest.fixture(scope="module")
def lm_run(shards, tmp_path_factory) -> Path:
    """A finished 2-step LM run from the preset file ``preset.json`` beside it."""
    root = tmp_path_factory.mktemp("lm_run")
    (root / "preset.json").write_text(json.dumps(LM_PRESET))
    assert main(["train", "--data", str(shards), "--out", str(root / "run"), "--config", str(root / "preset.json"),
                 "--no-progress"]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def other_shards(shards, tmp_path_factory) -> Path:
    """Shards of other text, written by the same tokenizer as ``shards``."""
    sources = sorted((Path(__file__).parents[2] / "src" / "implicitlm" / "eval").glob("*.py"))
    out = tmp_path_factory.mktemp("other") / "data"
    write_shards(read_documents(sources), load_tokenizer(shards.parent / "tokenizer"), out, test_fraction=0.2,
                 progress=False)
    return out


def other_preset(tmp_path: Path) -> str:
    (tmp_path / "other.json").write_text(json.dumps({**LM_PRESET, "model": {**LM_PRESET["model"], "hidden_size": 32}}))
    return str(tmp_path / "other.json")


LM_RESUME_CHANGES = {
    "model-option": (lambda tmp_path, data: ["--model", "hidden_size=64"],
                     "--resume continues the run with its own model; only --train may change"),
    "other-config": (lambda tmp_path, data: ["--config", other_preset(tmp_path)],
                     "the preset's hidden_size=32 is not the run's 16"),
    "model-preset": (lambda tmp_path, data: ["--model-preset", "mamba2-130m-bounded"],
                     "the preset's num_hidden_layers=24 is not the run's 1"),
    "other-data": (lambda tmp_path, data: ["--data", str(data)],
                   "the run trained on token shards ("),
    "edited-data-record": (lambda tmp_path, data: edit_data_record(tmp_path / "run", "x"),
                           "trainer.json: checkpoint metadata 'data' must be a dict or null, got 'x'"),
}


def edit_data_record(run: Path, data) -> list[str]:
    meta_file = latest_checkpoint(run) / "trainer.json"
    meta_file.write_text(json.dumps({**read_trainer_meta(latest_checkpoint(run)), "data": data}))
    return []


@pytest.mark.parametrize("change", LM_RESUME_CHANGES, ids=list(LM_RESUME_CHANGES))
def test_an_lm_resume_refuses_another_model_preset_or_data(lm_run, shards, other_shards, tmp_path, capsys, change):
    """before: ``train --resume`` ignored --model, --config and --model-preset, and trained on
    other shards (its trainer.json recorded "data": null), all with exit 0."""
    options, expected = LM_RESUME_CHANGES[change]
    out = tmp_path / "run"
    shutil.copytree(lm_run, out, symlinks=True)
    given = options(tmp_path, other_shards)
    before = run_bytes(out)
    capsys.readouterr()
    command = [*lm_train(shards, out, "total_steps=3"), "--resume", *given]
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    if change == "other-data":
        # The shards' folder is named data: a path, not the flag.
        assert f"resuming on token shards ({other_shards}: " in err[0], err
        assert err[0].endswith("would change its batches: resume with --data FOLDER, the run's own"), err
    assert run_bytes(out) == before


def test_an_lm_resume_takes_its_own_preset_and_data_and_one_of_a_former_run_without_a_digest(
        lm_run, shards, tmp_path, caplog):
    out = tmp_path / "run"
    shutil.copytree(lm_run, out, symlinks=True)
    preset = str(lm_run.parent / "preset.json")
    assert read_trainer_meta(latest_checkpoint(out))["data"]["shards_sha256"]
    assert main([*lm_train(shards, out, "total_steps=3"), "--resume", "--config", preset]) == 0
    edit_data_record(out, None)
    assert main([*lm_train(shards, out, "total_steps=4"), "--resume"]) == 0
    assert "written before runs recorded their data" in caplog.text
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 4


def test_a_resume_with_a_preset_and_no_run_says_there_is_nothing_to_resume(lm_run, shards, tmp_path, capsys):
    """before: ``words train --resume --preset demo`` said "not a model directory (no config.json)"."""
    preset = str(lm_run.parent / "preset.json")
    for command in ([*lm_train(shards, tmp_path / "none", "total_steps=3"), "--resume", "--config", preset],
                    [*resume(tmp_path / "none", "total_steps=3"), "--preset", "demo"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{tmp_path / 'none'}: nothing to resume" in err[0], err
