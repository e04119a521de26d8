"""Fault injection in training: stop signals, SIGKILL, NaN, a full disk, a half-done checkpoint swap.

Each test injects one fault into a real run and asserts what the user is promised: a
clean exit with a checkpoint, no lost work beyond the last checkpoint, an exact resume,
and a previous checkpoint left intact.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from implicitlm.cli import main
from implicitlm.core.errors import NumericalFault
from implicitlm.models import load_model
from implicitlm.train import checkpoint as checkpoint_module
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.core.run_folder import read_trainer_meta
from implicitlm.train.guard import TrainingInterrupted
from implicitlm.train.run_log import run_folder_lock
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import train

from tests.support.signals import signal_this_thread
from tests.support.models import tiny_model

WORDS_MODEL = dict(vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8, label_alignment="aligned")
MODEL = ["hidden_size=16", "num_hidden_layers=1", "state_size=8", "head_dim=8", "chunk_size=16"]
SETTINGS = ["group=S3", "sequence_length=6", "batch_size=8", "lr=0.01", "warmup_steps=2", "log_every=1",
            "total_steps=8", "bounded_fraction=0.5", "free_max_iter=6", "free_phantom_steps=2"]


def train_command(out: Path, *settings: str) -> list[str]:
    options = [arg for option in MODEL for arg in ("--model", option)]
    train = [arg for setting in (*SETTINGS, *settings) for arg in ("--train", setting)]
    return ["words", "train", "--out", str(out), "--no-progress", *options, *train]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_model(run).state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def logged_losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole")
    assert main(train_command(out)) == 0
    return out


def start_training(out: Path, *settings: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "implicitlm", *train_command(out, *settings)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def signal_after_a_checkpoint(out: Path, signum: int) -> subprocess.Popen:
    """A run checkpointing every 2 steps into ``out``, sent ``signum`` once its first checkpoint is written."""
    process = start_training(out, "checkpoint_every=2")
    deadline = time.monotonic() + 120
    while not any(out.glob("checkpoints/step_*/trainer.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before the fault could be injected"
    process.send_signal(signum)
    return process


# ---------------------------------------------------------------- process faults


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_cleanly_then_resume_is_exact(tmp_path, uninterrupted):
    out = tmp_path / "run"
    process = signal_after_a_checkpoint(out, signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1].startswith("implicitlm: stopped by SIGTERM after step")
    assert "Traceback" not in err
    stopped_at = read_trainer_meta(latest_checkpoint(out))["step"]
    assert 2 <= stopped_at < 8, "the run finished before the signal arrived"
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 8
    assert logged_losses(out) == logged_losses(uninterrupted)
    assert_same_weights(weights(out), weights(uninterrupted))


@pytest.mark.slow
def test_sigkill_loses_only_the_steps_since_the_last_checkpoint(tmp_path, uninterrupted):
    out = tmp_path / "run"
    process = signal_after_a_checkpoint(out, signal.SIGKILL)
    process.wait(timeout=60)
    saved = read_trainer_meta(latest_checkpoint(out))["step"]
    assert saved % 2 == 0 and saved < 8
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert logged_losses(out) == logged_losses(uninterrupted)
    assert_same_weights(weights(out), weights(uninterrupted))


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_step_finishes_it_and_checkpoints(tmp_path, signal_number):
    model = tiny_model(**WORDS_MODEL)
    calls = []

    def signal_on_third_forward(module, inputs, output):
        calls.append(1)
        if len(calls) == 3:
            signal_this_thread(signal_number)

    model.get_input_embeddings().register_forward_hook(signal_on_third_forward)
    config = TrainConfig.for_task("words", group="S3", sequence_length=6, batch_size=8, total_steps=6, log_every=1)
    previous = signal.getsignal(signal_number)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(model, config, tmp_path, progress=False)
    assert stopped.value.step == 3 and stopped.value.exit_code == 128 + signal_number
    assert read_trainer_meta(latest_checkpoint(tmp_path))["step"] == 3
    assert_same_weights(weights(tmp_path), model.state_dict())
    assert signal.getsignal(signal_number) is previous  # the handlers are the caller's again


def test_a_repeated_sigterm_is_recorded_and_a_second_sigint_interrupts():
    from implicitlm.train.guard import StopSignals

    # Whatever handler was there before, as a library may have set one that ignores SIGINT.
    original = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            signal_this_thread(signal.SIGTERM)
            signal_this_thread(signal.SIGTERM)  # as when a whole process group is signalled
            assert stop.received == signal.SIGTERM
            signal_this_thread(signal.SIGINT)
            assert stop.received == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                signal_this_thread(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the caller's handler again
    finally:
        signal.signal(signal.SIGINT, original)


def test_a_checkpoint_swap_cut_between_its_two_renames_is_recovered_on_resume(tmp_path):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    # What a kill between "move the old checkpoint aside" and "move the new one in" leaves.
    checkpoint = latest_checkpoint(out)
    os.replace(checkpoint, checkpoint.with_name(f".{checkpoint.name}.old"))
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=8",
                 "--train", "bounded_fraction=0.5"]) == 0
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 8


# ---------------------------------------------------------------- numerical faults


def nan_at_fifth_forward(model, where: str) -> None:
    """Makes the 5th training forward (step 4) non-finite: in its logits (so its loss), or in every iterate.
    Forwards without gradient (the loop trying updated weights before a checkpoint) are not counted."""
    calls = []

    def hook(module, inputs, output):
        if not torch.is_grad_enabled():
            return output
        calls.append(1)
        if len(calls) != 5:
            return output
        if where == "loss":
            output.logits = output.logits * float("nan")
            return output
        return output * float("nan")

    module = model if where == "loss" else model.get_input_embeddings()
    module.register_forward_hook(hook)


@pytest.mark.parametrize(("where", "message"), [("loss", "loss is nan"), ("iterates", "NaN or infinite")])
def test_nan_stops_training_before_the_update_and_keeps_the_last_good_checkpoint(tmp_path, where, message):
    model = tiny_model(**WORDS_MODEL)
    nan_at_fifth_forward(model, where)
    config = TrainConfig.for_task(
        "words", group="S3", sequence_length=6, batch_size=8, total_steps=8, log_every=1, checkpoint_every=2,
    )
    with pytest.raises(NumericalFault, match=rf"step 4: .*{message}.*; last good checkpoint: .*checkpoint"):
        train(model, config, tmp_path, progress=False)
    assert read_trainer_meta(latest_checkpoint(tmp_path))["step"] == 4
    saved = weights(tmp_path)
    assert all(torch.isfinite(value).all() for value in saved.values())
    # The faulty step's update was never applied: memory still holds the checkpointed weights.
    assert_same_weights(saved, model.state_dict())


@pytest.mark.parametrize("warmup", ["0", "2"])
@pytest.mark.parametrize("unroll", ["0", "1"])
def test_an_overflowing_run_exits_1_with_one_line_and_never_checkpoints_blown_weights(tmp_path, capsys, warmup, unroll):
    code = main(train_command(
        tmp_path / "run", "lr=1e30", f"warmup_steps={warmup}", f"unroll_steps={unroll}", "checkpoint_every=1"
    ))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("implicitlm: error: ") and "step " in err[0]
    if latest_checkpoint(tmp_path / "run") is not None:
        # The checkpoint called good holds the weights of a working model, not 1e28s.
        assert max(float(value.abs().max()) for value in weights(tmp_path / "run").values()) < 100


def test_an_overwriting_run_that_fails_before_its_first_checkpoint_leaves_the_earlier_run(tmp_path, capsys):
    """Before: ``--overwrite`` deleted the earlier run first, so a run failing at its first
    step left neither."""
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    earlier = {str(p.relative_to(out)): p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))}
    failing = [*train_command(out, "lr=1e30", "warmup_steps=0", "unroll_steps=0", "checkpoint_every=1"), "--overwrite"]
    assert main(failing) == 1
    assert {str(p.relative_to(out)): p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))} == earlier
    assert main([*train_command(out, "total_steps=1", "bounded_fraction=1.0"), "--overwrite"]) == 0
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_0000001"]
    assert not list(out.glob(".*"))  # the earlier run, set aside, went with the new run's checkpoint


def tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.mark.slow
def test_an_earlier_run_outlives_an_overwriting_run_killed_before_its_first_checkpoint(tmp_path):
    """Before: the finished run waited in RUN/.earlier_run.XXXX.tmp, --resume said there was
    nothing to resume, and the next run removed it as a killed run's temporary."""
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    earlier = tree(out)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "implicitlm", *train_command(out, "total_steps=100000"), "--overwrite"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    started = lambda: (out / ".earlier_run").is_dir() and (out / "metrics.jsonl").exists()  # noqa: E731
    while not started() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None and not list(out.glob("checkpoints/step_*")), "no new run to kill before its checkpoint"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    with run_folder_lock(out):  # whoever holds the folder next
        assert tree(out) == earlier
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=3"]) == 0
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 3


def test_an_earlier_run_half_set_aside_by_a_killed_run_is_put_back(tmp_path):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    earlier = tree(out)
    (out / ".earlier_run.moving").mkdir()  # killed between two of its renames
    for name in ("metrics.jsonl", "checkpoints"):
        os.replace(out / name, out / ".earlier_run.moving" / name)
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=3"]) == 0
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 3
    assert tree(out)["metrics.jsonl"].startswith(earlier["metrics.jsonl"]) and not list(out.glob(".*"))


def test_an_overwriting_run_killed_after_its_first_checkpoint_replaces_the_earlier_run(tmp_path):
    out, killed = tmp_path / "run", tmp_path / "killed"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    assert main(train_command(killed, "total_steps=1", "bounded_fraction=1.0")) == 0
    (killed / ".earlier_run").mkdir()  # the earlier run, set aside, waiting for the end of the run
    for entry in out.iterdir():
        os.replace(entry, killed / ".earlier_run" / entry.name)
    newer = {name: data for name, data in tree(killed).items() if not name.startswith(".earlier_run")}
    with run_folder_lock(killed):
        assert tree(killed) == newer
    assert read_trainer_meta(latest_checkpoint(killed))["step"] == 1


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_while_checkpointing_leaves_the_previous_checkpoint_intact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    before = weights(out)
    real_save = torch.save

    def disk_full(state, file):
        real_save(state, file)
        file.truncate(100)  # what a write cut by ENOSPC leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), file.name)

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full)
    code = main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "No space left on device" in err[0]
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 2
    assert_same_weights(weights(out), before)
    staging = [p.name for p in out.iterdir() if p.name.startswith(".") ]
    assert staging == []  # no staging left (the lock file stays, released)


# ---------------------------------------------------------------- bad input found late


def test_bad_input_found_after_the_run_folder_exists_leaves_no_folder(tmp_path, capsys, monkeypatch):
    from implicitlm.core.errors import DataError
    from implicitlm.tasks import words as word_task

    def unreadable(*args, **kwargs):
        raise DataError("words.npy: row 7 holds token 9, outside the group's 6 elements")

    monkeypatch.setattr(word_task, "generate_words", unreadable)
    out = tmp_path / "run"
    assert main(train_command(out)) == 2
    assert "row 7" in capsys.readouterr().err
    assert not out.exists()


def test_bad_input_found_late_leaves_what_another_wrote_in_the_run_folder(tmp_path, capsys, monkeypatch):
    """before: the command line removed the new run's folder whole, with a file another
    command had written there meanwhile."""
    from implicitlm.core.errors import DataError
    from implicitlm.tasks import words as word_task

    out = tmp_path / "run"

    def unreadable(*args, **kwargs):
        (out / "train_words.npy").write_bytes(b"another command's")
        raise DataError("words.npy: row 7 holds token 9, outside the group's 6 elements")

    monkeypatch.setattr(word_task, "generate_words", unreadable)
    assert main(train_command(out)) == 2
    assert "row 7" in capsys.readouterr().err
    assert os.listdir(out) == ["train_words.npy"]  # the run's log and tensorboard folder removed


def test_bad_input_on_resume_keeps_the_run_folder_and_its_checkpoint(tmp_path, capsys, monkeypatch):
    from implicitlm.core.errors import DataError
    from implicitlm.tasks import words as word_task

    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0

    def unreadable(*args, **kwargs):
        raise DataError("words.npy: truncated")

    monkeypatch.setattr(word_task, "generate_words", unreadable)
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=4"]) == 2
    assert read_trainer_meta(latest_checkpoint(out))["step"] == 2


@pytest.mark.parametrize(
    ("from_evaluation", "message"),
    [(1, "NaN or infinite at every evaluation"), (3, r"NaN or infinite for \d+ sample\(s\) in the fixed-point solve")],
)
def test_nan_in_one_samples_iterates_stops_training(tmp_path, from_evaluation, message):
    """The first row the map is evaluated on is NaN from evaluation 1 (no finite image at
    all) or 3 (the solve returns the sample's best finite image, and the loss stays
    finite) to the last of step 2's four-evaluation solve; the phantom step after it is
    left finite."""
    model = tiny_model(**WORDS_MODEL)
    steps, evaluations = [], []

    def count_steps(module, inputs, output):
        if torch.is_grad_enabled():  # not the loop's gradient-free try of updated weights
            steps.append(1)
            evaluations.clear()

    def nan_in_first_row(module, inputs, output):
        evaluations.append(1)
        if len(steps) == 3 and from_evaluation <= len(evaluations) <= 4:
            z = output[0].clone()
            z[0] = float("nan")
            return z, output[1]
        return output

    model.get_input_embeddings().register_forward_hook(count_steps)
    model.stack.register_forward_hook(nan_in_first_row)
    config = TrainConfig.for_task(
        "words", group="S3", sequence_length=6, batch_size=8, total_steps=6, bounded_max_iter=4, log_every=1,
        checkpoint_every=1,
    )
    with pytest.raises(NumericalFault, match=rf"step 2: .*{message}"):
        train(model, config, tmp_path, progress=False)
    assert read_trainer_meta(latest_checkpoint(tmp_path))["step"] == 2
    assert_same_weights(weights(tmp_path), model.state_dict())


def test_an_out_path_that_is_a_file_is_bad_input(tmp_path, capsys):
    (tmp_path / "taken").write_text("notes")
    assert main(train_command(tmp_path / "taken")) == 2
    assert capsys.readouterr().err.strip() == f"implicitlm: error: {tmp_path / 'taken'}: File exists"
    assert (tmp_path / "taken").read_text() == "notes"


@pytest.mark.slow
def test_resume_on_a_word_file_continues_its_epochs_exactly_and_refuses_other_words(tmp_path, capsys):
    words = tmp_path / "words.npy"
    assert main(["words", "generate", "--group", "S3", "--length", "6", "--count", "20", "--out", str(words)]) == 0
    on_file = ["--data", str(words)]
    # 20 words in batches of 8: 2 batches an epoch, so 7 steps cross three epoch boundaries.
    assert main([*train_command(tmp_path / "whole", "total_steps=7", "bounded_fraction=1.0"), *on_file]) == 0
    assert main([*train_command(tmp_path / "run", "total_steps=3", "bounded_fraction=1.0"), *on_file]) == 0
    resume = ["words", "train", "--out", str(tmp_path / "run"), "--resume", "--no-progress", "--train", "total_steps=7"]
    capsys.readouterr()
    assert main(resume) == 2
    assert "trained on a word file" in capsys.readouterr().err
    # Other words of the same group, count and length: only their content tells them apart.
    other = tmp_path / "other.npy"
    assert main(["words", "generate", "--group", "S3", "--length", "6", "--count", "20", "--seed", "1", "--out", str(other)]) == 0
    capsys.readouterr()
    assert main([*resume, "--data", str(other)]) == 2
    assert "resume with --data FILE, the run's own" in capsys.readouterr().err
    assert main([*resume, *on_file]) == 0
    assert logged_losses(tmp_path / "run") == logged_losses(tmp_path / "whole")
    assert_same_weights(weights(tmp_path / "run"), weights(tmp_path / "whole"))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda run: torch.save({"optimizer": {}}, latest_checkpoint(run) / "training_state.pt"), "expected scheduler"),
        (lambda run: torch.save({"optimizer": {}, "scheduler": {}, "torch_rng": torch.zeros(3)},
                                latest_checkpoint(run) / "training_state.pt"), "does not fit this run"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text(
            json.dumps({**read_trainer_meta(latest_checkpoint(run)), "step": "ten"})),
         "trainer.json: checkpoint metadata 'step' must be an integer >= 0, got 'ten'"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text(json.dumps(
            {k: v for k, v in read_trainer_meta(latest_checkpoint(run)).items() if k != "step"})),
         "expected the step count in 'step', got none"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text('{"step": 2}'), "expected the training settings"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text("[1]"), "expected a JSON object"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text(
            json.dumps({**read_trainer_meta(latest_checkpoint(run)), "train": {}})), "the training settings lack batch_size"),
        (lambda run: (latest_checkpoint(run) / "trainer.json").write_text(json.dumps(
            {**read_trainer_meta(latest_checkpoint(run)), "train": {k: v for k, v in read_trainer_meta(latest_checkpoint(run))["train"].items()
                                                          if k != "lr"}})), "lack lr; a resume would run them at their defaults"),
    ],
    ids=["missing-keys", "wrong-state", "step-not-a-number", "no-step", "no-settings", "meta-not-an-object", "empty-settings",
         "one-setting-missing"],
)
def test_a_damaged_training_state_is_one_line_on_resume(tmp_path, capsys, damage, expected):
    run = tmp_path / "run"
    assert main(train_command(run, "total_steps=2", "bounded_fraction=1.0")) == 0
    damage(run)
    capsys.readouterr()
    assert main(["words", "train", "--out", str(run), "--resume", "--no-progress", "--train", "total_steps=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_a_learning_rate_given_on_resume_is_the_one_trained_with(tmp_path):
    out = tmp_path / "run"
    settings = ("lr=0.001", "warmup_steps=0", "decay_fraction=0", "total_steps=3", "bounded_fraction=1.0", "log_every=1")
    assert main(train_command(out, *settings)) == 0
    resumed = ["words", "train", "--out", str(out), "--resume", "--no-progress",
               "--train", "lr=0.005", "--train", "total_steps=5", "--train", "min_lr=0.0001"]
    assert main(resumed) == 0
    rates = {row["step"]: row["lr"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    # The rate logged after a step is the next step's: constant, then the floor past the end.
    assert rates[1] == pytest.approx(0.001) and rates[3] == pytest.approx(0.005) and rates[4] == pytest.approx(0.0001)
    assert read_trainer_meta(latest_checkpoint(out))["train"]["lr"] == 0.005


def test_a_second_run_on_a_folder_in_use_is_refused(tmp_path, capsys):
    from implicitlm.train.run_log import run_folder_lock

    out = tmp_path / "run"
    with run_folder_lock(out):  # a run in progress (here: this process)
        assert main(train_command(out, "total_steps=1", "bounded_fraction=1.0")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "another process is writing it" in err[0] and str(os.getpid()) in err[0]
        assert not (out / "metrics.jsonl").exists()
    assert main(train_command(out, "total_steps=1", "bounded_fraction=1.0")) == 0  # released with the run


@pytest.mark.parametrize("entry", ["metrics.jsonl", "checkpoints", "tensorboard", "checkpoints/step_0000001/trainer.json"])
def test_symbolic_links_inside_a_run_folder_are_refused(tmp_path, capsys, entry):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=1", "bounded_fraction=1.0")) == 0
    outside = tmp_path / "elsewhere"
    (out / entry).rename(outside)
    (out / entry).symlink_to(outside)
    before = outside.read_bytes() if outside.is_file() else sorted(p.name for p in outside.iterdir())
    capsys.readouterr()
    resume = ["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=2"]
    assert main(resume) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a symbolic link inside a run folder" in err[0] and entry.split("/")[0] in err[0]
    assert before == (outside.read_bytes() if outside.is_file() else sorted(p.name for p in outside.iterdir()))


@pytest.mark.parametrize("how", [["--overwrite"], ["--resume"]])
def test_a_run_folder_given_as_a_link_is_refused_with_what_it_leads_to_unchanged(tmp_path, capsys, how):
    """Before: ``--overwrite`` through a link to a finished run replaced that run."""
    run, link = tmp_path / "run", tmp_path / "link"
    assert main(train_command(run, "total_steps=1", "bounded_fraction=1.0")) == 0
    link.symlink_to(run)
    before = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    if how == ["--resume"]:
        command = ["words", "train", "--out", str(link), "--no-progress", "--train", "total_steps=2", *how]
    else:
        command = [*train_command(link, "total_steps=1", "bounded_fraction=1.0"), *how]
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{link}: a symbolic link; write into a file or folder of its own" in err[0], err
    assert before == {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "damage, message",
    [
        (b'{"step": 0, "loss": 1.0}\n[1, 2]\n{"step": 1, "loss": 1.0}\n', "metrics.jsonl:2: expected a JSON object"),
        (b'{"step": 0, "loss": 1.0}\n\xff\xfe junk\n{"step": 1, "loss": 1.0}\n', "metrics.jsonl:2: expected a JSON object"),
        (b'{"step": 0, "loss": 1.0}\n{"step": "one"}\n', None),  # the last line: a kill cut it, dropped
    ],
    ids=["not-an-object", "not-utf8", "cut-last-line"],
)
def test_a_damaged_training_log_on_resume_is_one_line_naming_it(tmp_path, capsys, damage, message):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0", "log_every=1")) == 0
    (out / "metrics.jsonl").write_bytes(damage)
    capsys.readouterr()
    code = main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=3"])
    err = capsys.readouterr().err.strip().splitlines()
    if message is None:
        assert code == 0 and [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 2]
    else:
        assert code == 2 and len(err) == 1 and message in err[0], err


def test_optimiser_moments_that_do_not_fit_the_parameters_are_refused_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    state_file = latest_checkpoint(out) / "training_state.pt"
    state = torch.load(state_file, weights_only=True)
    first = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][first]["exp_avg"] = torch.zeros(3, 5)
    torch.save(state, state_file)
    capsys.readouterr()
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit this run (optimiser state 'exp_avg' of shape (3, 5)" in err[0], err


def test_a_full_disk_while_writing_the_weights_is_one_line(tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError
    from transformers import modeling_utils

    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    before = weights(out)

    def disk_full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", disk_full)
    capsys.readouterr()
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "model.safetensors" in err[0], err
    assert_same_weights(weights(out), before)


def test_temporaries_a_killed_run_left_are_removed_by_the_next_run_on_the_folder(tmp_path, caplog):
    """A SIGKILL during a checkpoint write leaves its staging folder (as large as the model and
    optimiser state) and maybe a log's temporary; the next run holding the folder removes them
    and says so in one line. Other files stay."""
    out = tmp_path / "run"
    assert main(train_command(out, "total_steps=2", "bounded_fraction=1.0")) == 0
    staging = out / "checkpoints" / ".step_0000003.k1l2m3n4.tmp"
    staging.mkdir()
    (staging / "training_state.pt").write_bytes(b"")
    (out / ".metrics.jsonl.a1b2c3.tmp").write_text('{"step": 2}')
    (out / "notes.txt").write_text("mine")
    caplog.clear()
    assert main(["words", "train", "--out", str(out), "--resume", "--no-progress", "--train", "total_steps=3"]) == 0
    assert not staging.exists() and not (out / ".metrics.jsonl.a1b2c3.tmp").exists()
    assert (out / "notes.txt").read_text() == "mine" and latest_checkpoint(out).name == "step_0000003"
    warnings = [record.getMessage() for record in caplog.records if "temporary" in record.getMessage()]
    assert warnings == [f"{out}: removed 2 temporary file(s) a stopped run left: "
                        ".metrics.jsonl.a1b2c3.tmp, checkpoints/.step_0000003.k1l2m3n4.tmp"]
