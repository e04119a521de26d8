"""Curriculum, checkpoints and the trainer's plumbing on word problems."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from implicitlm.cli import main
from implicitlm.data.word_storage import load_words
from implicitlm.deq import OptionError
from implicitlm.models import ModelLoadError, load_model
from implicitlm.train.checkpoint import CheckpointError, load_training_state, save_checkpoint
from implicitlm.train.curriculum import Curriculum, Phase
from implicitlm.train.schedule import planned
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import train
from tests.support.models import tiny_model

WORDS_MODEL = dict(vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=4, head_dim=8, label_alignment="aligned")


def test_curriculum_phases_switch_at_their_boundaries():
    curriculum = Curriculum.unroll_bounded_free(3, 5, 2, unroll_depth=6, bounded=(4, 1), free=(24, 4), free_tol=0.05)
    names = [curriculum.phase_at(step).name for step in range(11)]
    assert names == ["unroll"] * 3 + ["bounded"] * 5 + ["free"] * 3  # the last phase holds past the end
    assert curriculum.total_steps == 10
    assert curriculum.boundaries() == [(0, "unroll"), (3, "bounded"), (8, "free")]
    assert curriculum.phase_at(8).fixed_point == {"unroll_steps": 0, "train_max_iter": 24, "phantom_steps": 4, "train_tol": 0.05}


def test_empty_phases_are_skipped():
    curriculum = Curriculum.unroll_bounded_free(0, 4, 0)
    assert {curriculum.phase_at(step).name for step in range(4)} == {"bounded"}


def test_phase_options_are_validated():
    with pytest.raises(OptionError, match="did you mean 'train_max_iter'"):
        Phase("free", 3, {"train_max_iters": 24})
    with pytest.raises(OptionError, match="negative"):
        Phase("free", -1)


def test_trainer_changes_the_iteration_budget_at_the_switch(tmp_path):
    model = tiny_model(**WORDS_MODEL)
    own = model.solver.options
    config = TrainConfig.for_task(
        "words", group="S3", sequence_length=5, batch_size=4, total_steps=4, bounded_fraction=0.5, bounded_max_iter=3,
        free_max_iter=7, free_tol=1e-12, log_every=1,
    )
    train(model, config, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["fp_batch_passes"]) for r in rows] == [("bounded", 3), ("bounded", 3), ("free", 7), ("free", 7)]
    assert [r["train_max_iter"] for r in rows] == [3, 3, 7, 7]
    # Each phase's options were its forwards'; the model's own stay its defaults, as it saves them
    # (before: the last phase's were left on it).
    trained = model.solver.options
    assert (trained.train_max_iter, trained.train_tol, trained.phantom_steps) == (own.train_max_iter, own.train_tol,
                                                                                  own.phantom_steps)


def test_the_contraction_stage_follows_the_free_phase_under_its_penalty(tmp_path):
    model = tiny_model(**WORDS_MODEL)
    config = TrainConfig.for_task(
        "words", group="S3", sequence_length=5, batch_size=4, total_steps=4, bounded_fraction=0.5, free_max_iter=7,
        free_tol=1e-12, contraction_steps=2, contraction_jacobian=0.3, log_every=1,
    )
    train(model, config, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["bounded", "free", "contraction", "contraction"]
    # The stage solves as the free phase does, and only it adds the penalty's term.
    assert [r["fp_batch_passes"] for r in rows[1:]] == [7, 7, 7]
    assert ["fp_jacobian_penalty" in r for r in rows] == [False, False, True, True]
    assert all(r["fp_jacobian_penalty"] > 0 for r in rows[2:])
    assert model.solver.options.jacobian_penalty == 0.0  # the stage's forwards', not the model's default


def test_an_explicit_model_refuses_the_contraction_stage():
    config = TrainConfig.for_task("words", total_steps=4, contraction_steps=2)
    with pytest.raises(OptionError, match="contraction_steps.*implicit"):
        config.curriculum(implicit=False)


def map_jacobian_norm(model, input_ids) -> float:
    """||df/dz||_F^2 / numel of ``model``'s map at its fixed point for ``input_ids``, exactly."""
    _, z, _ = model.eval().solve_fixed_point(input_ids, max_iter=300, tol=1e-6)
    with model.fixed_point_map(input_ids) as (_, f):
        jacobian = torch.autograd.functional.jacobian(f, z)
    return float(jacobian.pow(2).sum() / z.numel())


def test_the_contraction_stage_makes_the_map_contract_at_its_fixed_points(tmp_path):
    """The same run, its last steps with and without the stage: the map's Jacobian at the
    fixed points of words it never saw is smaller after the stage."""
    def trained(contraction_steps: int):
        model = tiny_model(**WORDS_MODEL)
        config = TrainConfig.for_task("words", group="S3", sequence_length=5, batch_size=16, total_steps=40, lr=3e-3,
                                      bounded_fraction=0.0, contraction_steps=contraction_steps, contraction_jacobian=1.0)
        train(model, config, tmp_path / str(contraction_steps), progress=False)
        return model

    words = torch.randint(0, 6, (8, 5), generator=torch.Generator().manual_seed(7))
    without, with_stage = map_jacobian_norm(trained(0), words), map_jacobian_norm(trained(20), words)
    assert with_stage < 0.6 * without, (with_stage, without)  # measured: 0.24 against 0.48


def test_generated_batches_are_reproducible(tmp_path):
    config = TrainConfig.for_task("words", group="S3", sequence_length=5, batch_size=4, total_steps=3, log_every=1)
    losses = []
    for run in ("a", "b"):
        train(tiny_model(**WORDS_MODEL), config, tmp_path / run, progress=False)
        losses.append([json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()])
    assert losses[0] == losses[1]


def test_checkpoint_round_trip_and_replacement(tmp_path):
    model = tiny_model(**WORDS_MODEL)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 3, dtype=torch.long), labels=torch.zeros(1, 3, dtype=torch.long)).loss.backward()
    optimizer.step()
    state = {"optimizer": optimizer.state_dict()}
    save_checkpoint(tmp_path / "ckpt", model, training_state=state, meta={"step": 1})
    save_checkpoint(tmp_path / "ckpt", model, training_state=state, meta={"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "no staging or retired folders left"
    assert json.loads((tmp_path / "ckpt" / "trainer.json").read_text()) == {"step": 2}
    state = load_training_state(tmp_path / "ckpt")
    assert state["optimizer"]["state"][0]["step"] == 1
    reloaded = load_model(tmp_path / "ckpt")
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny_model(**WORDS_MODEL)
    save_checkpoint(tmp_path / "ckpt", model, meta={"step": 1})

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ckpt", model, meta={"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert json.loads((tmp_path / "ckpt" / "trainer.json").read_text()) == {"step": 1}


def test_corrupt_training_state_is_a_clear_error(tmp_path):
    state = {"optimizer": torch.optim.AdamW(tiny_model(**WORDS_MODEL).parameters()).state_dict()}
    save_checkpoint(tmp_path / "ckpt", tiny_model(**WORDS_MODEL), training_state=state)
    (tmp_path / "ckpt" / "training_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="training_state.pt"):
        load_training_state(tmp_path / "ckpt")


@pytest.mark.parametrize("damage", ["no_config", "bad_json", "foreign_type", "no_weights", "truncated_weights"])
def test_damaged_model_directory_is_a_clear_error(tmp_path, damage):
    save_checkpoint(tmp_path / "ckpt", tiny_model(**WORDS_MODEL))
    config, weights = tmp_path / "ckpt" / "config.json", tmp_path / "ckpt" / "model.safetensors"
    if damage == "no_config":
        config.unlink()
    elif damage == "bad_json":
        config.write_text("{")
    elif damage == "foreign_type":
        config.write_text(json.dumps({"model_type": "gpt2"}))
    elif damage == "no_weights":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="ckpt"):
        load_model(tmp_path / "ckpt")


def learning_rates(warmup_steps: int, total_steps: int, decay_steps: int, min_lr_ratio: float) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, planned(warmup_steps, total_steps, decay_steps, min_lr_ratio))
    rates = []
    for _ in range(total_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_learning_rate_warms_up_holds_then_falls_by_square_root():
    # Decay progress 0, 1/4, 1/2, 3/4 over the last four steps: 1 - sqrt(p), floored at 0.1.
    decay = [0.1 + 0.9 * (1 - (p / 4) ** 0.5) for p in range(4)]
    assert learning_rates(2, 10, 4, 0.1) == pytest.approx([0.1, 0.55, 1.0, 1.0, 1.0, 1.0, *decay])
    assert decay[-1] == pytest.approx(0.2206, abs=1e-4)


def test_warmup_wins_where_it_overlaps_the_decay():
    rates = learning_rates(8, 10, 5, 0.0)
    assert rates[:8] == pytest.approx([step / 8 for step in range(8)])
    assert rates[8:] == pytest.approx([1.0, 1 - 0.5**0.5])


def test_word_trainer_decays_over_the_last_share_of_all_phases(tmp_path):
    config = TrainConfig.for_task(
        "words", group="S3", sequence_length=5, batch_size=4, lr=0.01, min_lr=0.001, warmup_steps=0,
        decay_fraction=0.5, total_steps=4, bounded_fraction=0.5, free_max_iter=5, log_every=1,
    )
    train(tiny_model(**WORDS_MODEL), config, tmp_path, progress=False)
    logged = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Each row logs the rate of the next step; the decay spans the free phase's two steps.
    expected = [0.01 * rate for rate in learning_rates(0, 4, 2, 0.1)[1:]] + [0.001]
    assert logged == pytest.approx(expected)


@pytest.mark.slow
def test_a_fresh_word_run_refuses_or_replaces_an_earlier_one(tmp_path, capsys):
    config = TrainConfig.for_task("words", group="S3", sequence_length=5, batch_size=4, total_steps=3, log_every=1)
    train(tiny_model(**WORDS_MODEL), config, tmp_path, progress=False)
    log = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(FileExistsError, match="holds a training run"):
        train(tiny_model(**WORDS_MODEL), config, tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl").read_bytes() == log
    shorter = TrainConfig.for_task("words", group="S3", sequence_length=5, batch_size=4, total_steps=2, log_every=1)
    train(tiny_model(**WORDS_MODEL), shorter, tmp_path, progress=False, overwrite=True)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    command = ["words", "train", "--out", str(tmp_path), "--no-progress", "--model", "hidden_size=16", "--model", "head_dim=8",
               "--train", "total_steps=1", "--train", "sequence_length=4", "--train", "batch_size=2"]
    assert main(command) == 2
    assert "continue it with --resume or replace it with --overwrite" in capsys.readouterr().err
    assert main([*command, "--overwrite"]) == 0


def test_warmup_longer_than_the_run_keeps_its_slope_for_a_resume_with_more_steps():
    assert learning_rates(10, 3, 0, 0.0) == pytest.approx([0.0, 0.1, 0.2])
    assert learning_rates(10, 3, 0, 0.0) == learning_rates(10, 7, 0, 0.0)[:3]


def logged_rates(run) -> dict[int, float]:
    """The rate each logged row gives: the next step's."""
    return {row["step"]: row["lr"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def test_a_run_resumed_with_more_steps_after_its_decay_began_decays_on_from_its_rate(tmp_path):
    """before: the 8-step schedule began its decay anew, the rate jumping from its decayed value
    back to the peak 0.01. Now the decay is re-planned from the rate reached to min_lr over the
    steps left (a finished run had reached min_lr), and a resume of that run goes on with it."""
    config = TrainConfig.for_task("words", group="S3", sequence_length=5, batch_size=4, lr=0.01, min_lr=0.001,
                                  warmup_steps=0, decay_fraction=0.5, total_steps=4, log_every=1, checkpoint_every=1,
                                  keep_checkpoints=10)
    longer = dataclasses.replace(config, total_steps=8)
    train(tiny_model(**WORDS_MODEL), config, tmp_path / "finished", progress=False)
    shutil.copytree(tmp_path / "finished", tmp_path / "stopped", symlinks=True)
    shutil.rmtree(tmp_path / "stopped" / "checkpoints" / "step_0000004")  # stopped after step 3, in the decay
    train(tiny_model(**WORDS_MODEL), longer, tmp_path / "finished", progress=False, resume=True)
    assert [logged_rates(tmp_path / "finished")[step] for step in range(3, 8)] == pytest.approx([0.001] * 5)
    train(tiny_model(**WORDS_MODEL), longer, tmp_path / "stopped", progress=False, resume=True)
    reached = planned(0, 4, 2, 0.1)(3)  # the share of the peak step 3 trained at
    shares = [0.1 + (reached - 0.1) * (1 - (p / 5) ** 0.5) for p in range(1, 5)]
    rates = logged_rates(tmp_path / "stopped")
    assert [rates[step] for step in range(2, 8)] == pytest.approx([0.01 * reached, *(0.01 * s for s in shares), 0.001])
    # Stopped again after step 6: the resume goes on with the re-planned decay.
    for step in (7, 8):
        shutil.rmtree(tmp_path / "stopped" / "checkpoints" / f"step_{step:07d}")
    train(tiny_model(**WORDS_MODEL), longer, tmp_path / "stopped", progress=False, resume=True)
    assert logged_rates(tmp_path / "stopped") == pytest.approx(rates)


def test_tensorboard_holds_the_scalars_of_the_jsonl_log_across_a_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = TrainConfig.for_task("words", group="S3", sequence_length=6, batch_size=8, total_steps=3, log_every=1)
    train(tiny_model(**WORDS_MODEL), config, tmp_path, progress=False)
    more = dataclasses.replace(config, total_steps=5)
    train(tiny_model(**WORDS_MODEL), more, tmp_path, progress=False, resume=True)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for name in ("loss", "grad_norm", "fp_passes_mean"):
        scalars = {event.step: event.value for event in events.Scalars(name)}
        assert scalars == pytest.approx({record["step"]: record[name] for record in logged}, rel=1e-6), name
    assert sorted(scalars) == list(range(5))
    assert "phase" not in events.Tags()["scalars"]



# ---------------------------------------------------------------- one trainer: former checkpoints, torchrun

WORD_SETTINGS = {"group": "S3", "sequence_length": 6, "batch_size": 8, "lr": 0.01, "warmup_steps": 1, "log_every": 1,
                 "total_steps": 4, "bounded_fraction": 0.5, "free_max_iter": 5, "free_phantom_steps": 2}


def as_former_word_checkpoint(run) -> None:
    """Rewrite a run's latest checkpoint as the former word trainer left its one checkpoint:
    ``RUN/checkpoint``, settings spelt ``train_length`` / ``bounded_steps`` / ``free_steps``,
    no batch position in the training state."""
    from implicitlm.core.run_folder import latest_checkpoint

    latest = latest_checkpoint(run)
    latest.rename(run / "checkpoint")
    (run / "checkpoints").rmdir()
    meta = json.loads((run / "checkpoint" / "trainer.json").read_text())
    settings = meta["train"]
    after_warm_up = settings["total_steps"] - settings["unroll_steps"]
    bounded = round(settings["bounded_fraction"] * after_warm_up)
    former = {k: v for k, v in settings.items() if k in (
        "group", "batch_size", "hard_prob", "lr", "min_lr", "weight_decay", "warmup_steps", "decay_fraction",
        "grad_clip", "seed", "unroll_steps", "unroll_depth", "bounded_max_iter", "bounded_phantom_steps", "free_max_iter",
        "free_phantom_steps", "free_tol", "log_every", "checkpoint_every", "precision", "compile")}
    former.update(train_length=settings["sequence_length"], bounded_steps=bounded, free_steps=after_warm_up - bounded)
    (run / "checkpoint" / "trainer.json").write_text(json.dumps({"step": meta["step"], "train": former, "data": None}))
    state = load_training_state(run / "checkpoint")
    del state["sampler"]
    torch.save(state, run / "checkpoint" / "training_state.pt")


def test_a_checkpoint_of_the_former_word_trainer_loads_and_resumes_exactly(tmp_path):
    config = TrainConfig.for_task("words", **WORD_SETTINGS, checkpoint_every=2, keep_checkpoints=2)
    train(tiny_model(**WORDS_MODEL), config, tmp_path / "whole", progress=False)
    train(tiny_model(**WORDS_MODEL), config, tmp_path / "run", progress=False)
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_0000004")  # as if stopped after step 2
    as_former_word_checkpoint(tmp_path / "run")
    assert load_model(tmp_path / "run").num_parameters() == tiny_model(**WORDS_MODEL).num_parameters()  # the run folder loads it
    assert main(["words", "train", "--out", str(tmp_path / "run"), "--resume", "--no-progress",
                 "--train", "total_steps=4", "--train", "bounded_fraction=0.5"]) == 0
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("run", "whole")]
    assert losses[0] == losses[1]
    resumed, uninterrupted = load_model(tmp_path / "run"), load_model(tmp_path / "whole")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_0000004"]
    for (name, a), (_, b) in zip(resumed.state_dict().items(), uninterrupted.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_words_train_under_torchrun_as_one_process_with_the_global_batch(tmp_path):
    import os
    import subprocess
    import sys

    model = ["--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=4",
             "--model", "head_dim=8"]

    def command(out, batch_size):
        settings = {**WORD_SETTINGS, "total_steps": 3, "batch_size": batch_size}
        train_options = [arg for key, value in settings.items() for arg in ("--train", f"{key}={value}")]
        return ["words", "train", "--out", str(tmp_path / out), "--no-progress", *model, *train_options]

    assert main(command("single", 8)) == 0
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "implicitlm"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*launch, *command("two", 4)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [[json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("single", "two")]
    for key in ("loss", "accuracy"):
        torch.testing.assert_close([r[key] for r in logged[1]], [r[key] for r in logged[0]], atol=1e-5, rtol=0, msg=key)
    for (name, a), (_, b) in zip(load_model(tmp_path / "two").state_dict().items(),
                                 load_model(tmp_path / "single").state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def test_resume_accepts_the_runs_own_preset_and_refuses_another(tmp_path, capsys):
    """``--resume --preset P`` with the preset the run started from continues it (a hostile
    probe found it refused); a preset that says otherwise is refused, naming the option."""
    preset = {"model": {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 4, "head_dim": 8,
                        "fixed_point": {"tau": 0.6, "max_iter": 20}},
              "train": {**WORD_SETTINGS, "total_steps": 2}}
    (tmp_path / "p.json").write_text(json.dumps(preset))
    start = ["words", "train", "--out", str(tmp_path / "run"), "--preset", str(tmp_path / "p.json"), "--no-progress"]
    assert main(start) == 0
    assert main([*start, "--resume", "--train", "total_steps=3"]) == 0
    assert json.loads((tmp_path / "run" / "checkpoints" / "step_0000003" / "trainer.json").read_text())["step"] == 3
    capsys.readouterr()
    for changed, named in ((dict(preset, model={**preset["model"], "hidden_size": 32}), "hidden_size=32"),
                           (dict(preset, train={**preset["train"], "lr": 0.5}), "lr=0.5"),
                           (dict(preset, model={**preset["model"], "fixed_point": {"tau": 0.9}}), "fixed_point.tau=0.9")):
        (tmp_path / "other.json").write_text(json.dumps(changed))
        assert main(["words", "train", "--out", str(tmp_path / "run"), "--preset", str(tmp_path / "other.json"),
                     "--resume", "--no-progress", "--train", "total_steps=3"]) == 2
        assert f"the preset's {named} is not the run's" in capsys.readouterr().err
    assert main([*start, "--resume"]) == 2  # the run now trains for 3 steps, the preset says 2
    assert "the preset's total_steps=2 is not the run's 3" in capsys.readouterr().err
    assert main([*start, "--resume", "--explicit"]) == 2
    assert "its own model, an implicit one" in capsys.readouterr().err


@pytest.fixture(scope="module")
def z6_run(tmp_path_factory):
    """A short run on Z6 (six elements, as the tiny model's vocabulary) at length 5."""
    out = tmp_path_factory.mktemp("z6") / "run"
    config = TrainConfig.for_task("words", group="Z6", sequence_length=5, batch_size=4, total_steps=2)
    train(tiny_model(**WORDS_MODEL), config, out, progress=False)
    return out


def test_a_second_stage_starts_from_the_runs_weights_on_its_task(z6_run, tmp_path):
    out = tmp_path / "stage"
    command = ["words", "train", "--init-from", str(z6_run), "--out", str(out), "--no-progress",
               "--train", "total_steps=2", "--train", "lr=1e-9", "--train", "min_lr=0", "--train", "contraction_steps=2"]
    assert main(command) == 0
    meta = json.loads((out / "latest" / "trainer.json").read_text())
    assert (meta["train"]["group"], meta["train"]["sequence_length"], meta["train"]["batch_size"]) == ("Z6", 5, 4)
    assert meta["initialised_from"] == str(z6_run / "checkpoints" / "step_0000002")
    card = (out / "latest" / "README.md").read_text()
    assert "   - contraction stage: 2 steps" in card and "2. implicit, from stage 1 (" in card
    # At a rate of 1e-9 the model is the source's.
    words = torch.randint(0, 6, (3, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = load_model(out).eval()(words).logits, load_model(z6_run).eval()(words).logits
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("flags, named", [
    (["--train", "group=S4"], "group S4 has 24 elements"),
    (["--resume"], "--init-from starts a new run"),
    (["--explicit"], "--init-from starts a new run"),
])
def test_a_second_stage_that_cannot_continue_its_source_is_refused_in_one_line(z6_run, tmp_path, capsys, flags, named):
    out = tmp_path / "stage"
    assert main(["words", "train", "--init-from", str(z6_run), "--out", str(out), "--no-progress", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("implicitlm") and named in error and "\n" not in error
    assert not out.exists()


def word_file(tmp_path, length: int) -> str:
    path = tmp_path / f"words{length}.npy"
    assert main(["words", "generate", "--group", "S3", "--length", str(length), "--count", "16", "--out", str(path)]) == 0
    return str(path)


def test_a_run_on_a_word_file_records_the_files_length_for_its_card_and_evaluations(tmp_path, capsys):
    """before: words of length 12 with a preset of length 16 trained at 12, but the checkpoint
    recorded 16: its card counted 16 tokens a word, and ``--multiples 1,2`` tested 16 and 32."""
    preset = {"model": {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 4, "head_dim": 8},
              "train": {**WORD_SETTINGS, "sequence_length": 16, "total_steps": 2}}
    (tmp_path / "p.json").write_text(json.dumps(preset))
    data = word_file(tmp_path, 12)
    start = ["words", "train", "--out", str(tmp_path / "run"), "--preset", str(tmp_path / "p.json"), "--data", data,
             "--no-progress"]
    capsys.readouterr()
    assert main(start) == 0
    assert "trained 2 steps, 192 tokens" in capsys.readouterr().out  # 2 steps of 8 words of 12 tokens
    latest = tmp_path / "run" / "latest"
    assert json.loads((latest / "trainer.json").read_text())["train"]["sequence_length"] == 12
    assert "1. implicit, from scratch: 2 steps, 192 tokens (words task, group S3, sequence length 12)" in (latest / "README.md").read_text()
    assert main(["words", "eval", str(tmp_path / "run"), "--multiples", "1,2", "--count", "4", "--max-iter", "2",
                 "--no-progress"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in rows if line.split() and line.split()[0].isdigit()] == ["12", "24"]
    # The preset given again to resume names its own length; the word file's is the run's.
    assert main([*start, "--resume", "--train", "total_steps=3"]) == 0
    assert json.loads((latest / "trainer.json").read_text())["train"]["sequence_length"] == 12


def test_a_length_asked_for_that_is_not_the_word_files_is_refused_in_one_line(tmp_path, capsys):
    data = word_file(tmp_path, 12)
    capsys.readouterr()
    assert main(["words", "train", "--out", str(tmp_path / "run"), "--data", data, "--no-progress",
                 "--train", "sequence_length=16", "--model", "hidden_size=16", "--model", "head_dim=8"]) == 2
    assert capsys.readouterr().err == (f"implicitlm: error: {data}: words of length 12, but sequence_length=16; a run "
                                       "trains at its word file's length (leave sequence_length out)\n")
    assert not (tmp_path / "run").exists()
    # From Python, the trainer refuses words whose length its settings do not record.
    config = TrainConfig.for_task("words", **{**WORD_SETTINGS, "sequence_length": 16})
    with pytest.raises(OptionError, match="training words of length 12, but sequence_length=16"):
        train(tiny_model(**WORDS_MODEL), config, tmp_path / "python", data=load_words(data), progress=False)


def test_a_resume_on_other_words_than_the_runs_says_which_in_one_line_with_the_fix(tmp_path, capsys):
    """before: the run's words were printed as a raw dict, and the message did not say to
    give them again."""
    data = word_file(tmp_path, 6)
    model = ["--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=4",
             "--model", "head_dim=8"]
    settings = [arg for key, value in WORD_SETTINGS.items() for arg in ("--train", f"{key}={value}")]
    on_file = ["words", "train", "--out", str(tmp_path / "file"), "--no-progress"]
    assert main([*on_file, *model, *settings, "--data", data]) == 0
    on_fresh = ["words", "train", "--out", str(tmp_path / "fresh"), "--no-progress"]
    assert main([*on_fresh, *model, *settings]) == 0
    digest = json.loads((tmp_path / "file" / "latest" / "trainer.json").read_text())["data"]["inputs_sha256"]
    capsys.readouterr()
    assert main([*on_file, "--resume", "--train", "total_steps=5"]) == 2
    assert capsys.readouterr().err == (
        f"implicitlm: error: {tmp_path / 'file' / 'checkpoints' / 'step_0000004'}: the run trained on a word file of 16 "
        f"words of length 6 over S3 (sha256 {digest[:12]}); resuming on fresh words would change its batches: resume "
        "with --data FILE, the run's own\n")
    assert main([*on_fresh, "--resume", "--data", data, "--train", "total_steps=5"]) == 2
    assert capsys.readouterr().err.endswith("would change its batches: resume without --data\n")


def test_a_run_stopped_before_its_first_checkpoint_is_said_to_hold_nothing_to_resume(tmp_path, capsys, monkeypatch):
    """before: the folder was said to hold a training run to "continue with --resume", and
    ``--resume`` then found no checkpoint, without saying what to do."""
    import implicitlm.train.trainer

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as the process is killed while it writes its first checkpoint

    command = ["words", "train", "--out", str(tmp_path / "run"), "--no-progress", "--model", "hidden_size=16",
               "--model", "head_dim=8", *[arg for key, value in WORD_SETTINGS.items() for arg in ("--train", f"{key}={value}")]]
    with monkeypatch.context() as patched:
        patched.setattr(implicitlm.train.trainer, "save_checkpoint", killed)
        assert main(command) == 130
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    capsys.readouterr()
    said = (f"implicitlm: error: {tmp_path / 'run'}: holds a run stopped before its first checkpoint (metrics.jsonl, "
            "tensorboard): nothing to resume; start it again with --overwrite\n")
    assert main(command) == 2
    assert capsys.readouterr().err == said
    assert main(["words", "train", "--out", str(tmp_path / "run"), "--resume", "--no-progress"]) == 2
    assert capsys.readouterr().err == said
    assert main([*command, "--overwrite"]) == 0
