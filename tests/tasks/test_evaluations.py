"""Tasks and the evaluations over them: ``implicitlm eval length|budget|convergence --task ...``
prints and writes what the task-group shortcuts (``words eval``, ``lm eval``, ``catbabi eval`` ...)
do, each task's rows are its metric's own and its record its own, and a combination that makes no
sense is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from implicitlm.cli import main
from implicitlm.data.babi_sample import SAMPLE_TASKS, write_babi_sample
from implicitlm.data.catbabi import build_catbabi
from implicitlm.data.shards import TokenShards
from implicitlm.eval.length import evaluate_by_length
from implicitlm.models import build_model, config_from_options
from implicitlm.tasks import TASKS, TaskEntry, make_task
from implicitlm.core.errors import OptionError
from implicitlm.eval.plots import DRAW_FIGURE
from implicitlm.tasks.base import EVALUATIONS, FIGURE_KINDS, Figure, Task, TaskRecord
from implicitlm.tasks.catbabi import answer_accuracy
from implicitlm.tasks.lm import perplexity_by_length
from implicitlm.tasks.word_scoring import word_accuracy
from implicitlm.tasks.words import held_out_words
from tests.support.models import tiny_model


def scoring_model(vocab: int, alignment: str):
    return tiny_model(architecture="mamba2", vocab_size=vocab, hidden_size=16, num_hidden_layers=1, state_size=8,
                      head_dim=8, chunk_size=8, implicit=True, label_alignment=alignment).eval()


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
    scoring_model(TokenShards(catbabi_folder, "train").vocab_size, "shifted").save_pretrained(folder)
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
    ("convergence", "convergence", ["--multiples", "1", "--count", "4", "--max-iter", "6"]),
])
def test_words_aliases_print_and_write_what_eval_task_words_does(evaluation, alias, options, capsys, tmp_path, trained_s3):
    run = str(trained_s3[1])  # the run folder: its latest checkpoint and training settings
    records = assert_same(capsys, tmp_path, ["words", alias, run, *options],
                          ["eval", evaluation, "--task", "words", run, *options])
    assert list(records) == ["word_length.json" if evaluation == "length" else "convergence.json"]


@pytest.mark.slow
def test_lm_eval_prints_and_writes_what_eval_length_task_lm_does(capsys, tmp_path, catbabi_folder, lm_checkpoint):
    options = [str(lm_checkpoint), "--data", str(catbabi_folder), "--split", "eval", "--lengths", "8,16",
               "--max-tokens", "64"]
    records = assert_same(capsys, tmp_path, ["lm", "eval", *options], ["eval", "length", "--task", "lm", *options])
    assert list(records) == ["lm_length.json"]


@pytest.mark.parametrize("shortcut, spelling", [
    ("words budget", "eval budget --task words"),
    ("lm budget", "eval budget --task lm"),
    ("lm convergence", "eval convergence --task lm"),
])
def test_a_budget_sweep_and_an_lm_convergence_report_have_one_spelling(shortcut, spelling, capsys, lm_checkpoint):
    """The task-group shortcuts that only repeated ``eval budget|convergence --task`` are gone."""
    with pytest.raises(SystemExit) as exit_info:
        main([*shortcut.split(), str(lm_checkpoint), "--out", "o"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*spelling.split(), "--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: implicitlm " + spelling.split(" --")[0])


def test_catbabi_eval_prints_and_writes_what_eval_length_task_catbabi_does(capsys, tmp_path, catbabi_folder, lm_checkpoint):
    options = [str(lm_checkpoint), "--data", str(catbabi_folder), "--sequence-length", "16", "--max-iter", "3"]
    records = assert_same(capsys, tmp_path, ["catbabi", "eval", *options], ["eval", "length", "--task", "catbabi", *options])
    record = records["catbabi.json"]
    assert record["answers"] == 6 and record["sequence_length"] == 16
    # The budget and what the fixed points came to, printed as every evaluation prints them (before: neither).
    assert record["budget"] == {"max_iter": 3, "tol": record["tol"], "passes": 0, "given": True}
    printed = outputs(capsys, tmp_path, "printed", ["catbabi", "eval", *options])[1].splitlines()
    assert printed[1] == f"budget: to tolerance {record['tol']:g} within 3 passes per solve (as given)"
    assert printed[-2].startswith(f"fixed points: {record['windows']}; not converged ")
    assert printed[-2].endswith(" non-finite") and " retried " in printed[-2]


def test_the_words_task_rows_are_word_accuracy_rows(tmp_path):
    model = scoring_model(6, "aligned")
    model.save_pretrained(tmp_path / "model")
    task = make_task("words", tmp_path / "model", group="S3", lengths=[6, 12], count=8, seed=2, batch_size=4)
    result = evaluate_by_length(task.solve_with(max_iter=3), mode="sequential")
    expected = [word_accuracy(model, *held_out_words("S3", n, 8, seed=2), mode="sequential", max_iter=3, batch_size=4)
                for n in (6, 12)]
    assert result["rows"] == expected and result["files"] is None
    assert task.model.solver.options == model.solver.options  # the evaluation's settings were its forwards' alone
    assert result["table"].splitlines()[:2] == [
        "budget: to tolerance 0.001 within 3 passes per solve (as given)",
        f"{'length':>8}{'last10':>9}{'all':>9}{'passes':>10}{'retries':>9}{'not converged':>15}"]


@pytest.mark.parametrize("depth, retries", [(None, 48), (1, 16), (0, 0)])
def test_word_rows_and_tables_give_the_retries_beside_the_passes(depth, retries, tmp_path):
    """A words evaluation in chunks of 4 whose every piece misses the tolerance: each chunk's
    rows are solved again at 2 tokens, then at 1 (the default depth, 3, reaches single tokens),
    14 budgets of 2 passes a chunk in all, 12 of them retries; the rows and the table give
    those passes apart (before: 56 passes a word and no word of retries), and retry_depth
    bounds them."""
    model = scoring_model(6, "aligned")
    model.save_pretrained(tmp_path / "model")
    task = make_task("words", tmp_path / "model", group="S3", lengths=[16], count=4, seed=2)
    task.solve_with(max_iter=2, tol=1e-9, chunk_length=4, **({} if depth is None else {"retry_depth": depth}))
    result = evaluate_by_length(task)
    [row] = result["rows"]
    assert row["fp_passes_mean"] == 4 * 2 + retries and row["fp_retry_passes_mean"] == retries
    assert row["fp_retried"] == (4 if retries else 0) and row["fp_not_converged"] == 4
    line = result["table"].splitlines()[-1].split()
    assert line[3:] == [f"{8 + retries:.1f}", f"{retries:.1f}", "100.00%"]


def test_word_rows_of_a_fixed_budget_record_its_passes_and_no_tolerance_budget(tmp_path):
    """Before, a row of 2 passes a solve recorded the max_iter and tol it never held."""
    scoring_model(6, "aligned").save_pretrained(tmp_path / "model")
    task = make_task("words", tmp_path / "model", group="S3", lengths=[8], count=4, seed=2).solve_with(passes=2)
    result = evaluate_by_length(task, mode="sequential")
    [row] = result["rows"]
    assert row["passes"] == 2 and "max_iter" not in row and "tol" not in row and row["fp_passes_mean"] == 2.0
    assert result["table"].splitlines()[0] == "budget: 2 passes per solve, no tolerance (as given)"


def test_the_lm_task_rows_are_perplexity_by_length_rows(catbabi_folder, lm_checkpoint):
    from implicitlm.models import load_model

    task = make_task("lm", lm_checkpoint, data=[catbabi_folder], split="eval", lengths=[8, 16], max_tokens=64)
    result = evaluate_by_length(task.solve_with(max_iter=4, tol=1e-2))
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


class SquaresTask(Task):
    """A task no module of eval/ knows: its rows square the test length, its record is its own."""

    name = "squares"
    OPTIONS = ()
    BATCH_SIZE = 1
    experiment = "squares_length"
    budget_experiment = "squares_budget"
    quality = "square"

    def __init__(self, checkpoint, figure_kind: str):
        super().__init__(checkpoint)
        self.figure_kind = figure_kind

    def evaluation_sets(self):
        return [2, 3]

    def evaluate(self, model, test_set, mode="simultaneous", fixed_point=None, warn=True, progress=False):
        return {"length": test_set, "square": test_set**2}

    def format_rows(self, rows):
        return "\n".join(f"{row['length']} {row['square']}" for row in rows)

    def length_record(self, rows, mode):
        series = [{"label": mode, "x": [row["length"] for row in rows], "y": [row["square"] for row in rows]}]
        figure = Figure(self.figure_kind, "squares", series, {"x": "length", "y": "square"}, vertical={"two": 2},
                        horizontal={"five": 5.0}, ylim=(0, 10))
        return TaskRecord(self.experiment, {"square@3": 9}, figure, series, figure.axes, {"mode": mode, "max_iter": self.model.fixed_point_options(self.fixed_point).max_iter})


@pytest.mark.parametrize("kind", FIGURE_KINDS)
def test_a_task_s_own_record_and_figure_are_written_by_the_length_evaluation(kind, tmp_path):
    scoring_model(6, "aligned").save_pretrained(tmp_path / "model")
    result = evaluate_by_length(
        SquaresTask(tmp_path / "model", kind).solve_with(max_iter=3), mode="sequential", out=tmp_path / "out"
    )
    assert result["rows"] == [{"length": 2, "square": 4}, {"length": 3, "square": 9}]
    # The budget first, as every length table gives it: the task's own table follows.
    assert result["table"] == "budget: to tolerance 0.001 within 3 passes per solve (as given)\n2 4\n3 9"
    record_file, figure_file = result["files"]
    assert (record_file.name, figure_file.name) == ("squares_length.json", "squares_length.png")
    record = json.loads(record_file.read_text())
    assert record["experiment"] == "squares_length" and record["checkpoint"] == str(tmp_path / "model")
    assert record["metrics"] == {"square@3": 9.0} and record["model"]["architecture"] == "mamba2"
    assert record["curves"] == [{"label": "sequential", "x": [2, 3], "y": [4, 9]}] and record["axes"]["y"] == "square"
    assert (record["mode"], record["max_iter"]) == ("sequential", 3)
    assert record["budget"] == {"max_iter": 3, "tol": 0.001, "passes": 0, "given": True}
    assert figure_file.read_bytes().startswith(b"\x89PNG")


def test_every_kind_of_figure_is_drawn_and_no_other_is_described():
    assert set(DRAW_FIGURE) == set(FIGURE_KINDS)
    with pytest.raises(OptionError, match="figure kind 'pie'"):
        Figure("pie", "title", [], {})


@pytest.mark.parametrize("name", TASKS)
def test_every_task_of_the_table_is_its_class_and_takes_the_evaluations_whose_records_it_names(name):
    from implicitlm.eval.convergence import EXPERIMENT

    entry = TASKS[name]
    task = entry.task_class()
    assert task.entry is entry and task.name == name
    assert task.EVALUATIONS == tuple(entry.records) == tuple(e for e in EVALUATIONS if e in entry.records)
    assert (task.experiment, task.budget_experiment) == (entry.records["length"], entry.records["budget"])
    assert task.BATCH_SIZE == entry.batch_size
    assert entry.records.get("convergence", EXPERIMENT) == EXPERIMENT


@pytest.mark.parametrize("name", [name for name, entry in TASKS.items() if entry.aliases])
def test_the_shortcuts_of_a_task_s_group_are_its_entry_s(name, capsys):
    for command, evaluation, help in TASKS[name].aliases:
        with pytest.raises(SystemExit):
            main([name, command, "--help"])
        printed = " ".join(capsys.readouterr().out.split())
        assert f"{help}; same as implicitlm eval {evaluation} --task {name}" in printed
        record = TASKS[name].records[evaluation]
        assert f"folder for {record}.json and {record}.png" in printed


class TabledSquaresTask(SquaresTask):
    """Squares as a line of the table names them: its class path is this module's."""

    entry = TaskEntry("squares", f"{__name__}:TabledSquaresTask", {"length": "squares_by_length", "budget": "squares_budget"},
                      batch_size=1)

    def __init__(self, checkpoint, batch_size=None):
        super().__init__(checkpoint, "bars")


def test_a_task_added_to_the_table_is_a_choice_of_eval_and_writes_the_record_its_entry_names(monkeypatch, tmp_path,
                                                                                              capsys):
    scoring_model(6, "aligned").save_pretrained(tmp_path / "model")
    argv = ["eval", "length", "--task", "squares", str(tmp_path / "model"), "--max-iter", "3"]
    with pytest.raises(SystemExit):
        main(argv)
    assert "argument --task: invalid choice: 'squares'" in capsys.readouterr().err
    monkeypatch.setitem(TASKS, "squares", TabledSquaresTask.entry)
    with pytest.raises(SystemExit):
        main(["eval", "length", "--help"])
    assert "(default: 256 for words, 8 for lm and catbabi, 1 for squares)" in " ".join(capsys.readouterr().out.split())
    code, printed, records = outputs(capsys, tmp_path, "out", argv)
    assert code == 0 and printed.splitlines()[-3:] == ["2 4", "3 9", "results: OUT/squares_by_length.json, plot: OUT/squares_by_length.png"]
    assert list(records) == ["squares_by_length.json"] and records["squares_by_length.json"]["metrics"] == {"square@3": 9.0}


@pytest.mark.parametrize("argv, fragment", [
    (["eval", "convergence", "--task", "catbabi", "CKPT", "--data", "DATA"], "convergence is not evaluated for the catbabi task"),
    (["eval", "length", "--task", "lm", "CKPT", "--data", "DATA", "--group", "S3"], "--group does not apply to the lm task"),
    (["eval", "length", "--task", "catbabi", "CKPT", "--data", "DATA", "--lengths", "8"], "--lengths does not apply"),
    (["eval", "budget", "--task", "words", "CKPT", "--max-tokens", "64", "--sequence-length", "8"],
     "--max-tokens, --sequence-length do not apply to the words task"),
    (["eval", "length", "--task", "lm", "CKPT"], "the lm task reads one --data folder"),
    (["eval", "length", "--task", "lm", "CKPT", "--data", "DATA", "--data", "DATA"], "the lm task reads one --data folder"),
    (["eval", "length", "--task", "catbabi", "CKPT", "--data", "DATA", "--split", "eval"], "--split eval: the catbabi task"),
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


def test_a_task_is_told_how_to_solve_once_and_gives_it_to_the_forwards_not_to_the_model_it_loads(tmp_path):
    """``Task.solve_with`` is the one way a task's solves are set: checked when given (before
    any data is read), a later call replacing what it names, the settings of every forward of
    its evaluations; the model it loads keeps the checkpoint's own options (before: they were
    set on it)."""
    model = build_model(config_from_options({"hidden_size": 16, "state_size": 8, "head_dim": 8, "num_hidden_layers": 1,
                                              "vocab_size": 6}))
    model.save_pretrained(tmp_path / "model")
    task = make_task("words", tmp_path / "model", group="S3", lengths=[4])
    with pytest.raises(OptionError, match="fixed-point option 'max_iter'"):
        task.solve_with(max_iter=0)
    with pytest.raises(OptionError, match="did you mean 'max_iter'"):
        task.solve_with(max_iters=3)
    assert task.solve_with(max_iter=3, tol=0.25).solve_with(max_iter=5).fixed_point == {"max_iter": 5, "tol": 0.25}
    loaded = task.load()
    assert loaded.solver.options == model.solver.options
    options = loaded.fixed_point_options(task.settings())
    assert (options.max_iter, options.tol, options.budget(None, None, "simultaneous")) == (5, 0.25, (5, 0.25))
    assert task.settings({"passes": 2}) == {"max_iter": 5, "tol": 0.25, "passes": 2} and task.fixed_point["max_iter"] == 5


SHIPPED_S5 = Path(__file__).parents[2] / "checkpoints" / "words" / "s5"
PASSES_TO_10000 = ",".join(map(str, range(1, 10001)))


@pytest.mark.parametrize("task, options", [
    ("words", ["--lengths", "16"]),
    ("lm", ["--data", "DATA", "--lengths", "8"]),
    ("catbabi", ["--data", "DATA", "--split", "valid", "--sequence-length", "12"]),
])
def test_a_sweep_past_the_time_limit_is_refused_with_its_estimate_before_it_starts(task, options, tmp_path, capsys,
                                                                                   monkeypatch, catbabi_folder,
                                                                                   lm_checkpoint):
    """Before: ``eval budget --passes 1,...,10000`` started a months-long run; only a words
    length evaluation estimated its time."""
    monkeypatch.setattr(TASKS[task].task_class(), "evaluate", lambda *args, **kwargs: pytest.fail("the sweep started"))
    checkpoint = SHIPPED_S5 if task == "words" else lm_checkpoint
    options = [str(catbabi_folder) if option == "DATA" else option for option in options]
    code = main(["eval", "budget", "--task", task, str(checkpoint), *options, "--passes", PASSES_TO_10000,
                 "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("implicitlm: error: a sweep of 10,000 points over 1 test set would take at least ")
    assert err[0].endswith(", past the limit of 1.0 days; give fewer --passes") and not (tmp_path / "out").exists()


class SlowSquaresTask(SquaresTask):
    """Squares whose every test set takes 13 hours at one pass."""

    def one_pass_seconds(self, model, test_set, mode):
        return 13 * 3600.0

    def evaluate(self, model, test_set, mode="simultaneous", fixed_point=None, warn=True, progress=False):
        pytest.fail("the evaluation started")


def test_the_test_sets_of_a_length_evaluation_are_timed_together(tmp_path):
    """Before: each words set was refused alone past a day, and lm and catbAbI sets not at all."""
    scoring_model(6, "aligned").save_pretrained(tmp_path / "model")
    with pytest.raises(OptionError, match=r"^an evaluation at 2 test lengths would take at least 1\.1 days here, past "
                                          r"the limit of 1\.0 days; give fewer or shorter lengths$"):
        evaluate_by_length(SlowSquaresTask(tmp_path / "model", "curves"), out=tmp_path / "out")


def test_convergence_statistics_past_the_time_limit_are_refused_before_a_token_is_solved(tmp_path, capsys, monkeypatch):
    from implicitlm.eval import convergence

    monkeypatch.setattr(convergence, "forward_seconds", lambda *args: 2 * 86400.0)
    monkeypatch.setattr(convergence, "token_passes", lambda *args, **kwargs: pytest.fail("a token was solved"))
    code = main(["words", "convergence", str(SHIPPED_S5), "--lengths", "16", "--out", str(tmp_path / "out"),
                 "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["implicitlm: error: convergence statistics of 1,024 tokens would take at least 2.0 "
                                 "days here, past the limit of 1.0 days; give shorter lengths, fewer words or tokens"]
