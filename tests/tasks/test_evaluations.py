"""Tasks and the evaluations over them: ``implicitlm eval length|budget|convergence --task ...``
prints and writes what the old spellings (``words eval``, ``lm budget``, ``catbabi eval`` ...)
do, each task's rows are its metric's own, and a combination that makes no sense is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from implicitlm.cli import main
from implicitlm.data.babi_sample import SAMPLE_TASKS, write_babi_sample
from implicitlm.data.catbabi import build_catbabi
from implicitlm.data.shards import TokenShards
from implicitlm.eval.length import evaluate_by_length
from implicitlm.models import build_model, config_from_options
from implicitlm.tasks import TASKS, make_task
from implicitlm.tasks.base import EVALUATIONS
from implicitlm.tasks.catbabi import answer_accuracy
from implicitlm.tasks.lm import perplexity_by_length
from implicitlm.tasks.word_scoring import word_accuracy
from implicitlm.tasks.words import held_out_words


def tiny_model(vocab: int, alignment: str, implicit: bool = True):
    torch.manual_seed(0)
    options = dict(architecture="mamba2", vocab_size=vocab, hidden_size=16, num_hidden_layers=1, state_size=8,
                   head_dim=8, chunk_size=8, implicit=implicit, label_alignment=alignment)
    return build_model(config_from_options(options)).eval()


@pytest.fixture(scope="module")
def catbabi_folder(tmp_path_factory) -> Path:
    """A built catbAbI folder of the shipped sample: token shards and answer positions."""
    root = tmp_path_factory.mktemp("catbabi")
    build_catbabi(write_babi_sample(root / "babi"), root / "data", tasks=SAMPLE_TASKS, seed=0, overwrite=True)
    return root / "data"


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory, catbabi_folder) -> Path:
    """A random language model over the catbAbI folder's vocabulary."""
    folder = tmp_path_factory.mktemp("lm") / "model"
    tiny_model(TokenShards(catbabi_folder, "train").vocab_size, "shifted").save_pretrained(folder)
    return folder


def outputs(capsys, tmp_path, name: str, argv: list[str]) -> tuple[int, str, dict]:
    """Exit code, printed text (the --out folder spelled OUT) and the records written there."""
    out = tmp_path / name
    code = main([*argv, "--no-progress", "--out", str(out)])
    printed = capsys.readouterr().out.replace(str(out), "OUT")
    records = {path.name: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}
    figures = sorted(path.name for path in out.glob("*.png"))
    assert [name.replace(".json", ".png") for name in records] == figures
    return code, printed, records


def assert_same(capsys, tmp_path, old: list[str], new: list[str]) -> dict:
    old_result = outputs(capsys, tmp_path, "old", old)
    new_result = outputs(capsys, tmp_path, "new", new)
    assert old_result[0] == 0 and old_result[2], old_result
    assert new_result == old_result
    return old_result[2]


@pytest.mark.slow
@pytest.mark.parametrize("evaluation, alias, options", [
    ("length", "eval", ["--multiples", "1,2", "--count", "16"]),
    ("budget", "budget", ["--lengths", "12", "--count", "8", "--budgets", "1,4"]),
    ("convergence", "convergence", ["--multiples", "1", "--count", "4", "--max-iter", "6"]),
])
def test_words_aliases_print_and_write_what_eval_task_words_does(evaluation, alias, options, capsys, tmp_path, trained_s3):
    run = str(trained_s3[1])  # the run folder: its latest checkpoint and training settings
    records = assert_same(capsys, tmp_path, ["words", alias, run, *options],
                          ["eval", evaluation, "--task", "words", run, *options])
    assert list(records) == [{"length": "word_length.json", "budget": "word_budget.json"}.get(evaluation, "convergence.json")]


@pytest.mark.slow
@pytest.mark.parametrize("evaluation, alias, options", [
    ("length", "eval", ["--split", "eval", "--lengths", "8,16", "--max-tokens", "64"]),
    ("budget", "budget", ["--split", "eval", "--lengths", "16", "--budgets", "1,3"]),
    ("convergence", "convergence", ["--split", "eval", "--lengths", "16", "--max-iter", "4"]),
])
def test_lm_aliases_print_and_write_what_eval_task_lm_does(evaluation, alias, options, capsys, tmp_path, catbabi_folder,
                                                          lm_checkpoint):
    data = ["--data", str(catbabi_folder)]
    assert_same(capsys, tmp_path, ["lm", alias, str(lm_checkpoint), *data, *options],
                ["eval", evaluation, "--task", "lm", str(lm_checkpoint), *data, *options])


def test_catbabi_eval_prints_and_writes_what_eval_length_task_catbabi_does(capsys, tmp_path, catbabi_folder, lm_checkpoint):
    options = [str(lm_checkpoint), "--data", str(catbabi_folder), "--sequence-length", "16", "--max-iter", "3"]
    records = assert_same(capsys, tmp_path, ["catbabi", "eval", *options], ["eval", "length", "--task", "catbabi", *options])
    assert records["catbabi.json"]["answers"] == 6 and records["catbabi.json"]["sequence_length"] == 16


def test_the_words_task_rows_are_word_accuracy_rows(tmp_path):
    model = tiny_model(6, "aligned")
    model.save_pretrained(tmp_path / "model")
    task = make_task("words", tmp_path / "model", group="S3", lengths=[6, 12], count=8, seed=2, batch_size=4)
    result = evaluate_by_length(task, mode="sequential", max_iter=3)
    expected = [word_accuracy(model, *held_out_words("S3", n, 8, seed=2), mode="sequential", max_iter=3, batch_size=4)
                for n in (6, 12)]
    assert result["rows"] == expected and result["files"] is None
    assert result["table"].splitlines()[0].split() == ["length", "last10", "all", "fp", "iters", "not", "converged"]


def test_the_lm_task_rows_are_perplexity_by_length_rows(catbabi_folder, lm_checkpoint):
    from implicitlm.models import load_model

    task = make_task("lm", lm_checkpoint, data=[catbabi_folder], split="eval", lengths=[8, 16], max_tokens=64)
    result = evaluate_by_length(task, max_iter=4, tol=1e-2)
    shards = TokenShards(catbabi_folder, "eval")
    assert result["rows"] == perplexity_by_length(load_model(lm_checkpoint), shards, [8, 16], 8, 64, max_iter=4, tol=1e-2)


def test_the_catbabi_task_row_is_answer_accuracy(catbabi_folder, lm_checkpoint, tmp_path):
    from implicitlm.models import load_model

    task = make_task("catbabi", lm_checkpoint, data=catbabi_folder, split="valid", sequence_length=12, stride=4)
    result = evaluate_by_length(task, mode="sequential", out=tmp_path / "out")
    expected = answer_accuracy(load_model(lm_checkpoint), catbabi_folder, "valid", 12, 4, mode="sequential")
    assert result["rows"] == [{"length": 12, **expected}]
    assert result["files"] == (tmp_path / "out" / "catbabi.json", tmp_path / "out" / "catbabi.png")
    record = json.loads(result["files"][0].read_text())
    assert record["split"] == "valid" and record["metrics"]["accuracy"] == expected["accuracy"]


def test_every_task_takes_the_evaluations_it_names():
    assert set(TASKS) == {"words", "lm", "catbabi"}
    assert TASKS["words"].EVALUATIONS == TASKS["lm"].EVALUATIONS == EVALUATIONS
    assert TASKS["catbabi"].EVALUATIONS == ("length", "budget")


@pytest.mark.parametrize("argv, fragment", [
    (["eval", "convergence", "--task", "catbabi", "CKPT", "--data", "DATA"], "convergence is not evaluated for --task catbabi"),
    (["eval", "length", "--task", "lm", "CKPT", "--data", "DATA", "--group", "S3"], "--group does not apply to --task lm"),
    (["eval", "length", "--task", "catbabi", "CKPT", "--data", "DATA", "--lengths", "8"], "--lengths does not apply"),
    (["eval", "budget", "--task", "words", "CKPT", "--max-tokens", "64", "--sequence-length", "8"],
     "--max-tokens, --sequence-length do not apply to --task words"),
    (["eval", "length", "--task", "lm", "CKPT"], "--task lm reads one --data folder"),
    (["eval", "length", "--task", "lm", "CKPT", "--data", "DATA", "--data", "DATA"], "--task lm reads one --data folder"),
    (["eval", "length", "--task", "catbabi", "CKPT", "--data", "DATA", "--split", "eval"], "--split eval: --task catbabi"),
    (["eval", "length", "--task", "tokens", "CKPT"], "argument --task: invalid choice"),
])
def test_a_combination_that_makes_no_sense_is_one_line_and_exit_2(argv, fragment, capsys, tmp_path, catbabi_folder,
                                                                   lm_checkpoint):
    argv = [{"CKPT": str(lm_checkpoint), "DATA": str(catbabi_folder)}.get(arg, arg) for arg in argv]
    if argv[1] != "length":
        argv += ["--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "out").exists()
