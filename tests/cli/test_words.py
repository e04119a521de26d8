"""The command line: outputs, and one-line errors with exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from implicitlm.cli import main
from implicitlm.core.errors import OptionError
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.data.word_storage import load_words
from implicitlm.data.words import verify_targets
from implicitlm.tasks import make_task


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clean_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("implicitlm: error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("suffix", [".csv", ".npy"])
def test_generate_writes_correct_words(tmp_path, capsys, suffix):
    out = tmp_path / f"words{suffix}"
    code, _, _ = run(capsys, "words", "generate", "--group", "A5", "--length", "9", "--count", "7", "--seed", "3", "--out", str(out))
    assert code == 0
    data = load_words(out, group="A5")
    assert data.inputs.shape == (7, 9) and data.inputs.dtype == np.uint8
    assert verify_targets("A5", data.inputs, data.targets)


def test_unknown_group_is_a_clean_error(tmp_path, capsys):
    code, _, err = run(capsys, "words", "generate", "--group", "Q8", "--length", "4", "--count", "2", "--out", str(tmp_path / "q.csv"))
    assert_clean_error(code, err, "Q8")
    assert not any(tmp_path.iterdir()), "nothing may be left behind"


def test_a_presets_misspelled_training_option_is_a_clean_error(tmp_path, capsys):
    # On the command line the parser refuses them (tests/cli/test_arguments.py); in a preset, the trainer.
    for train, expected in (({"total_step": 3}, ("total_step", "total_steps")),
                            ({"train_length": 3}, ("'train_length' is now sequence_length",))):
        (tmp_path / "preset.json").write_text(json.dumps({"train": train}))
        code, _, err = run(capsys, "words", "train", "--out", str(tmp_path / "r"), "--preset", str(tmp_path / "preset.json"))
        assert_clean_error(code, err, *expected)


def test_misspelled_fixed_point_option_is_a_clean_error(tmp_path, capsys):
    code, _, err = run(
        capsys, "words", "train", "--out", str(tmp_path / "r"), "--model", 'fixed_point={"stop_modes": "abs"}'
    )
    assert_clean_error(code, err, "stop_modes", "did you mean 'stop_mode'")


def test_a_model_option_of_another_family_is_a_clean_error(tmp_path, capsys):
    # A key no family takes the parser refuses (tests/cli/test_arguments.py); one another family takes, the run.
    code, _, err = run(capsys, "words", "train", "--out", str(tmp_path / "r"), "--model", "architecture=mamba",
                       "--model", "head_dim=8")
    assert_clean_error(code, err, "head_dim")


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["words", "eval", "x", "--mode", "sideways"])
    assert exit_info.value.code == 2


def test_eval_of_missing_checkpoint_is_a_clean_error(tmp_path, capsys):
    code, _, err = run(capsys, "words", "eval", str(tmp_path / "nope"), "--lengths", "8")
    assert_clean_error(code, err, "nope")


def test_eval_of_malformed_csv_is_a_clean_error(tmp_path, capsys, trained_s3):
    _, train_run = trained_s3
    bad = tmp_path / "bad.csv"
    bad.write_text("seed,input,target\n0,1 2 x,1 3 5\n")
    code, _, err = run(capsys, "words", "eval", str(train_run), "--data", str(bad))
    assert_clean_error(code, err, "bad.csv", "2")


@pytest.mark.parametrize(
    "group, fragment",
    [("S4", "trained on S3"), ("Z2", "trained on S3"), ("Z6", "trained on S3")],
)
def test_eval_on_another_group_than_the_trained_one_is_refused(group, fragment, capsys, trained_s3):
    _, train_run = trained_s3
    code, _, err = run(capsys, "words", "eval", str(train_run), "--group", group, "--lengths", "6")
    assert_clean_error(code, err, f"--group {group}", fragment)


@pytest.mark.slow
def test_eval_solves_in_chunks_of_the_training_length_unless_told_otherwise(tmp_path, capsys, trained_s3):
    _, train_run = trained_s3
    rows = {}
    for name, flags in (("default", []), ("whole", ["--chunk-length", "0"]), ("six", ["--chunk-length", "6"])):
        out = tmp_path / name
        code, _, _ = run(capsys, "words", "eval", str(train_run), "--lengths", "48", "--count", "16",
                         "--no-progress", "--out", str(out), *flags)
        assert code == 0
        rows[name] = json.loads((out / "word_length.json").read_text())["rows"][0]
    assert [rows[name]["chunk_length"] for name in ("default", "whole", "six")] == [12, 48, 6]
    # Each chunk converges in about as many iterations as it has tokens, the whole word in about 48.
    assert rows["whole"]["fp_passes_mean"] < rows["default"]["fp_passes_mean"]


def test_eval_of_prefixes_draws_the_longest_words_once_and_scores_each_length_on_them(tmp_path, capsys, trained_s3):
    """--prefixes: the rows of the longest words' prefixes, as their own evaluation would give
    them (the same words given as a file, cut to each length), the record saying so."""
    from implicitlm.data.word_storage import save_words
    from implicitlm.tasks.words import held_out_words

    _, train_run = trained_s3
    common = ["--count", "8", "--seed", "4", "--no-progress"]
    code, stdout, _ = run(capsys, "words", "eval", str(train_run), "--multiples", "4,1,2", "--prefixes", *common,
                          "--out", str(tmp_path / "prefixes"))
    assert code == 0
    record = json.loads((tmp_path / "prefixes" / "word_length.json").read_text())
    assert [row["length"] for row in record["rows"]] == [12, 24, 48] and record["prefixes"] is True
    inputs, targets = held_out_words("S3", 48, 8, seed=4)
    for row in record["rows"]:
        words = tmp_path / f"words{row['length']}.npy"
        save_words(words, inputs[:, :row["length"]], targets[:, :row["length"]], {"group": "S3"})
        assert run(capsys, "words", "eval", str(train_run), "--data", str(words), *common,
                   "--out", str(tmp_path / words.stem))[0] == 0
        alone = json.loads((tmp_path / words.stem / "word_length.json").read_text())
        assert alone["rows"] == [row] and alone["prefixes"] is False
    with pytest.raises(SystemExit):  # a length evaluation's flag only
        main(["eval", "budget", "--task", "words", str(train_run), "--lengths", "12", "--prefixes"])
    assert "unknown option --prefixes" in capsys.readouterr().err
    with pytest.raises(OptionError, match="the budget evaluation reads each length's own words"):
        make_task("words", train_run, lengths=[12, 24], prefixes=True).prepare("budget")


@pytest.mark.slow
def test_train_then_eval_writes_a_record_and_a_figure(tmp_path, capsys, trained_s3):
    _, train_run = trained_s3
    out = tmp_path / "eval"
    code, stdout, _ = run(
        capsys, "words", "eval", str(train_run), "--multiples", "1,2", "--count", "32", "--out", str(out)
    )
    assert code == 0
    record = json.loads((out / "word_length.json").read_text())
    assert record["experiment"] == "word_length" and record["train_length"] == 12
    assert [r["length"] for r in record["rows"]] == [12, 24]
    assert all(0.0 <= r["accuracy"] <= 1.0 and "accuracy_last10" in r for r in record["rows"])
    assert record["metrics"] == {
        **{f"accuracy_last10@{r['length']}": r["accuracy_last10"] for r in record["rows"]},
        **{f"accuracy@{r['length']}": r["accuracy"] for r in record["rows"]},
    }
    # The convergence behind each figure: every fixed point counted, the misses by reason.
    for row in record["rows"]:
        assert row["fp_fixed_points"] == 32 and row["max_iter"] >= row["length"]
        reasons = row["fp_stopped_at_budget"] + row["fp_diverged"] + row["fp_non_finite"]
        assert row["fp_not_converged"] == reasons and row["fp_not_converged_share"] == reasons / 32
    assert "not converged" in stdout
    assert (out / "word_length.png").stat().st_size > 0
    assert "last10" in stdout


def test_words_train_runs_and_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run(
        capsys, "words", "train", "--out", str(out), "--no-progress",
        "--train", "group=Z3", "--train", "sequence_length=6", "--train", "batch_size=8",
        "--train", "total_steps=3", "--train", "log_every=1",
        "--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=4", "--model", "head_dim=8",
    )
    assert code == 0, err
    assert (out / "checkpoints" / "step_0000003" / "model.safetensors").is_file()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    "command, trainer",
    [(("words", "train"), "words"), (("train",), "lm"), (("models", "import"), None)],
    ids=["words-train", "lm-train", "models-import"],
)
def test_options_lists_every_model_and_training_key_with_its_default(command, trainer, capsys):
    import dataclasses
    import re

    from implicitlm.deq.options import FixedPointOptions
    from implicitlm.models.families import BY_ARCHITECTURE
    from implicitlm.models.loading import model_option_names
    from implicitlm.train.config import OTHER_TASKS_FIELDS, TrainConfig

    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    command_for_keys = "implicitlm options" + (f" --trainer {trainer}" if trainer else "")
    assert help_text.endswith(command_for_keys), help_text[-200:]

    assert main(command_for_keys.split()[1:]) == 0
    out = capsys.readouterr().out
    listed = dict(re.findall(r"^  (\w+)\s+(\S+)\s+\S", out, flags=re.MULTILINE))
    model_keys = {name for family in BY_ARCHITECTURE for name in model_option_names(family)} - {"architecture"}
    assert model_keys <= set(listed) and {f.name for f in dataclasses.fields(FixedPointOptions)} <= set(listed)
    assert listed["max_iter"] == str(FixedPointOptions.max_iter)
    if trainer is not None:
        defaults = TrainConfig.for_task(trainer)
        for field in dataclasses.fields(TrainConfig):
            if field.name == "task" or OTHER_TASKS_FIELDS.get(field.name, trainer) != trainer:
                assert field.name not in listed, field.name
            else:
                default = getattr(defaults, field.name)
                assert listed[field.name] == json.dumps(default, separators=(",", ":")), field.name
    else:
        assert "training options" not in out


def test_every_option_has_a_meaning():
    import dataclasses

    from implicitlm.deq.options import FixedPointOptions
    from implicitlm.models.families import FAMILIES
    from implicitlm.models.loading import _own_defaults
    from implicitlm.models.configuration import ImplicitLMConfig
    from implicitlm.train.config import TrainConfig

    for schema in (FixedPointOptions, TrainConfig):
        assert set(schema.FIELD_HELP) == {f.name for f in dataclasses.fields(schema)}, schema.__name__
    for config in (ImplicitLMConfig, *(family.config_class for family in FAMILIES)):
        assert set(config.FIELD_HELP) == set(_own_defaults(config)), config.__name__


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_device_or_fifo_given_as_a_file_is_named_as_such(tmp_path, capsys, special, trained_s3):
    import os

    path = special
    if special == "fifo":
        path = str(tmp_path / "words.npy")
        os.mkfifo(path)
    checkpoint = str(trained_s3[1])
    for argv in (["words", "eval", checkpoint, "--data", path, "--no-progress"],
                 ["tokenizer", "train", path, "--out", str(tmp_path / "tok")]):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, path, "got a device, FIFO or socket")


def test_a_load_problem_is_one_line_without_transformers_report_before_it(tmp_path, capsys, trained_s3):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(latest_checkpoint(trained_s3[1]), checkpoint)
    (checkpoint / "model.safetensors.sha256").unlink(missing_ok=True)
    tensors = load_file(checkpoint / "model.safetensors")
    save_file({**tensors, "extra.weight": torch.zeros(2)}, checkpoint / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run(capsys, "words", "eval", str(checkpoint), "--lengths", "6", "--no-progress")
    assert_clean_error(code, err, "holds weights the config has no place for", "extra.weight")


def test_words_eval_recovers_a_checkpoint_swap_cut_between_its_renames(tmp_path, capsys, trained_s3):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(latest_checkpoint(trained_s3[1]), run_dir / ".checkpoint.old")  # what the kill left
    code, out, _ = run(capsys, "words", "eval", str(run_dir / "checkpoint"), "--lengths", "6", "--count", "8", "--no-progress")
    assert code == 0 and "last10" in out and (run_dir / "checkpoint" / "config.json").is_file()


def test_an_unwritable_run_folder_is_named_not_a_temporary_file(tmp_path, capsys, monkeypatch):
    import errno
    import os
    import tempfile

    def read_only(dir, prefix, suffix):
        temporary = os.path.join(dir, f"{prefix}x1y2z3{suffix}")
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), temporary)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    out = tmp_path / "run"
    code, _, err = run(capsys, "words", "train", "--out", str(out), "--no-progress", "--model", "hidden_size=16",
                       "--model", "state_size=8", "--model", "head_dim=8", "--train", "total_steps=1",
                       "--train", "sequence_length=4", "--train", "batch_size=4")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == f"implicitlm: error: {out.absolute() / 'checkpoints' / 'step_0000001'}: Read-only file system"


# A trained S5 model shipped with the package: chunked simultaneous solves, as the paper's.
SHIPPED_S5 = str(Path(__file__).parents[2] / "checkpoints" / "words" / "s5")


@pytest.mark.parametrize("options, refusal", [
    (["--lengths", "800000000000", "--count", "8"], "8 test words of length 800,000,000,000 would take at least"),
    (["--lengths", "1000000000", "--count", "512"], "512 test words of length 1,000,000,000 would take at least"),
    (["--lengths", "1000000000", "--count", "512", "--chunk-length", "0"],
     "512 test words of length 1,000,000,000 needs at least"),
])
def test_an_absurd_size_of_words_is_refused_before_a_forward_over_a_whole_window(options, refusal, capsys, monkeypatch):
    """Before: the memory estimate's forward over a batch's window of 65,536 positions came
    first, then the time estimate's (208 s for the first, 42 s for the second here): a size
    past any limit is refused from its sizes, then from a forward over one chunk's positions."""
    from implicitlm.tasks import word_scoring

    monkeypatch.setattr(word_scoring, "forward_bytes", lambda *args: pytest.fail("a whole window's forward was probed"))
    code, out, err = run(capsys, "words", "eval", SHIPPED_S5, *options, "--no-progress")
    assert_clean_error(code, err, refusal)
    assert out == ""


def test_words_longer_than_the_time_limit_allows_are_refused_up_front(capsys, trained_s3):
    # before: read window after window in flat memory until killed
    _, train_run = trained_s3
    code, out, err = run(capsys, "words", "eval", str(train_run), "--lengths", "1000000000", "--no-progress")
    assert_clean_error(code, err, "512 test words of length 1,000,000,000 would take at least", "past the limit of 1.0 days",
                       "--lengths", "--count")
    assert out == ""
