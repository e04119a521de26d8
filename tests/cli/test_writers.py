"""Every command that writes, taken from the parser so that a new one cannot be left out: a
target holding finished work is refused unless ``--overwrite`` (and replaced with it), a
target another process is writing is refused, and a full disk fails in one line leaving the
earlier target as it was and no temporaries; then the cases users met, one test each."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

from implicitlm.cli import build_parser, main
from implicitlm.core.errors import OptionError
from implicitlm.core.run_folder import LATEST, latest_checkpoint
from implicitlm.core.targets import writer_lock
from implicitlm.data.babi_sample import SAMPLE_TASKS, write_babi_sample
from implicitlm.data.catbabi import build_catbabi
from implicitlm.data.corpus import read_documents
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.shards import TokenShards
from implicitlm.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from implicitlm.tasks.words import WordsTask
from implicitlm.train.run_log import run_folder_lock
from tests.support.models import tiny_model

pytestmark = pytest.mark.usefixtures("offline_hub")  # lm downstream reads its sets from local files

MARKER = b"finished work\n"
SLICES = Path(__file__).parents[1] / "support" / "downstream"
# Leaf commands that only print.
READ_ONLY = {"models list", "models show", "options"}
TINY_MAMBA2 = {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 8, "head_dim": 8, "chunk_size": 8}
WORDS_RUN = [
    "--no-progress", *[arg for key, value in TINY_MAMBA2.items() for arg in ("--model", f"{key}={value}")],
    "--train", "group=Z3", "--train", "sequence_length=6", "--train", "batch_size=4", "--train", "total_steps=1",
]
LM_RUN = [
    "--no-progress", *[arg for key, value in TINY_MAMBA2.items() for arg in ("--model", f"{key}={value}")],
    *[arg for setting in ("sequence_length=8", "batch_size=2", "batch_tokens=16", "total_steps=1", "warmup_steps=1",
                          "checkpoint_every=1") for arg in ("--train", setting)],
]
GOOD_RECORD = {
    "experiment": "word_length", "checkpoint": "c", "metrics": {"accuracy@6": 0.5},
    "model": {"architecture": "mamba2", "implicit": True, "parameters": 10, "dtype": "float32"},
    "curves": [{"label": "simultaneous mode", "x": [6, 12], "y": [0.5, 0.25]}], "axes": {"x": "length"},
}
TEXT = "\n".join(f"line {i}: the cat sat on the mat, and the dog ran to the door {i % 7}." for i in range(60))


def checkpoint_model(vocab_size: int):
    return tiny_model(architecture="mamba2", **TINY_MAMBA2, vocab_size=vocab_size, implicit=True,
                      fixed_point={"max_iter": 4}).eval()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> SimpleNamespace:
    """What the commands read, built once: runs, checkpoints, shards, sources, presets."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "corpus.txt").write_text(TEXT)
    tokenizer = train_tokenizer([TEXT], 280, root / "tokenizer")
    write_shards(read_documents([root / "corpus.txt"]), tokenizer, root / "shards", test_fraction=0.2, progress=False)
    checkpoint_model(len(tokenizer)).save_pretrained(root / "lm")
    save_tokenizer(tokenizer, root / "lm")
    build_catbabi(write_babi_sample(root / "babi"), root / "catbabi", tasks=SAMPLE_TASKS, seed=0)
    checkpoint_model(TokenShards(root / "catbabi", "train").vocab_size).save_pretrained(root / "catbabi_lm")
    save_tokenizer(load_tokenizer(root / "catbabi" / "tokenizer"), root / "catbabi_lm")
    assert main(["words", "train", "--out", str(root / "words_run"), *WORDS_RUN]) == 0
    torch.manual_seed(0)
    Mamba2ForCausalLM(Mamba2Config(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_heads=2, head_dim=16, expand=2,
        state_size=8, n_groups=1, chunk_size=8, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
    )).save_pretrained(root / "hf")
    (root / "records").mkdir()
    (root / "records" / "word_length.json").write_text(json.dumps(GOOD_RECORD))
    demo = {"model": {**TINY_MAMBA2, "fixed_point": {"max_iter": 4}},
            "train": {"group": "Z3", "sequence_length": 6, "batch_size": 4, "log_every": 1},
            "implicit_train": {"total_steps": 1}, "explicit_train": {"total_steps": 1},
            "eval": {"length_multiples": [1], "count": 4, "sequential_count": 2}}
    (root / "demo.json").write_text(json.dumps(demo))
    # The standard library's first files; a loose tolerance keeps the held-out solves short.
    lm_demo = {"corpus": {"max_bytes": 6_000, "vocab_size": 280, "test_fraction": 0.2},
               "model": {**TINY_MAMBA2, "fixed_point": {"max_iter": 4, "tol": 0.5}},
               "train": {"sequence_length": 8, "batch_size": 2, "batch_tokens": 16, "total_steps": 1,
                         "warmup_steps": 1, "eval_every": 1, "eval_batches": 1, "checkpoint_every": 1}}
    (root / "lm_demo.json").write_text(json.dumps(lm_demo))
    (root / "cwd").mkdir()
    return SimpleNamespace(root=root, words_run=root / "words_run", lm=root / "lm", shards=root / "shards",
                           catbabi=root / "catbabi", catbabi_lm=root / "catbabi_lm", babi=root / "babi")


@dataclass(frozen=True)
class Case:
    """A writing command: its arguments (given the inputs and the folder it writes in), its
    target and the file of finished work planted there (both relative to that folder), and
    how another process holds the target while writing it."""

    argv: Callable[[SimpleNamespace, Path], list]
    target: str
    marker: str
    hold: Callable[[Path], contextlib.AbstractContextManager] = writer_lock


def words_eval(command: list[str], *options: str) -> Callable:
    return lambda i, out: [*command, i.words_run, "--lengths", "6", "--count", "4", *options, "--no-progress",
                           "--out", out / "out"]


def lm_eval(command: list[str], *options: str) -> Callable:
    return lambda i, out: [*command, i.lm, "--data", i.shards, "--lengths", "8", "--max-tokens", "16", *options,
                           "--no-progress", "--out", out / "out"]


def record(name: str) -> tuple[str, str]:
    return f"out/{name}.json", f"out/{name}.json"


BUDGETS = ("--max-iter", "1,2")
CASES = {
    "demo": Case(lambda i, out: ["demo", "--preset", i.root / "demo.json", "--out", out / "out", "--no-progress"],
                 "out", "out/results.json"),
    "lm demo": Case(lambda i, out: ["lm", "demo", "--preset", i.root / "lm_demo.json", "--out", out / "out",
                                    "--no-progress"], "out", "out/results.json"),
    "words generate": Case(lambda i, out: ["words", "generate", "--group", "S3", "--length", "4", "--count", "3",
                                           "--out", out / "words.npy"], "words.npy", "words.npy"),
    "words train": Case(lambda i, out: ["words", "train", "--out", out / "run", *WORDS_RUN], "run",
                        "run/metrics.jsonl", run_folder_lock),
    "words eval": Case(words_eval(["words", "eval"]), *record("word_length")),
    "words convergence": Case(words_eval(["words", "convergence"], "--max-iter", "4"), *record("convergence")),
    "eval length": Case(words_eval(["eval", "length", "--task", "words"]), *record("word_length")),
    "eval budget": Case(words_eval(["eval", "budget", "--task", "words"], *BUDGETS), *record("word_budget")),
    "eval convergence": Case(words_eval(["eval", "convergence", "--task", "words"], "--max-iter", "4"),
                             *record("convergence")),
    "lm eval": Case(lm_eval(["lm", "eval"]), *record("lm_length")),
    "eval budget --task lm": Case(lm_eval(["eval", "budget", "--task", "lm"], *BUDGETS), *record("lm_budget")),
    "eval convergence --task lm": Case(lm_eval(["eval", "convergence", "--task", "lm"], "--max-iter", "4"),
                                       *record("convergence")),
    "eval budget --task catbabi": Case(lambda i, out: ["eval", "budget", "--task", "catbabi", i.catbabi_lm, "--data",
                                                       i.catbabi, *BUDGETS, "--no-progress", "--out", out / "out"],
                                       *record("catbabi_budget")),
    "lm downstream": Case(lambda i, out: ["lm", "downstream", i.lm, "--data-dir", SLICES, "--tasks", "piqa",
                                          "--limit", "4", "--batch-size", "4", "--no-progress", "--out", out / "out"],
                          *record("downstream")),
    "catbabi eval": Case(lambda i, out: ["catbabi", "eval", i.catbabi_lm, "--data", i.catbabi, "--no-progress",
                                         "--out", out / "out"], *record("catbabi")),
    "catbabi build": Case(lambda i, out: ["catbabi", "build", i.babi, "--tasks", "1,6,8,15,19", "--out", out / "built"],
                          "built", "built/catbabi.json"),
    "catbabi sample": Case(lambda i, out: ["catbabi", "sample", "--out", out / "babi"], "babi", "babi/qa1_train.txt"),
    "tokenizer train": Case(lambda i, out: ["tokenizer", "train", i.root / "corpus.txt", "--vocab-size", "280",
                                            "--out", out / "tok"], "tok", "tok/tokenizer.json"),
    "corpus build": Case(lambda i, out: ["corpus", "build", i.root / "corpus.txt", "--tokenizer", i.root / "tokenizer",
                                         "--test-fraction", "0.2", "--no-progress", "--out", out / "shards"],
                         "shards", "shards/index.json"),
    "models import": Case(lambda i, out: ["models", "import", i.root / "hf", "--out", out / "imported"],
                          "imported", "imported/config.json"),
    "train": Case(lambda i, out: ["train", "--data", i.shards, "--out", out / "run", *LM_RUN], "run",
                  "run/metrics.jsonl", run_folder_lock),
    "report": Case(lambda i, out: ["report", i.root / "records", "--out", out / "report"], "report/report.md",
                   "report/report.md"),
    "generate": Case(lambda i, out: ["generate", i.lm, "--prompt", "the cat", "--max-new-tokens", "3", "--seed", "0",
                                     "--out", out / "text.txt"], "text.txt", "text.txt"),
    "solver train": Case(lambda i, out: ["solver", "train", i.lm, "--data", i.shards, "--steps", "1", "--batch-size", "1",
                                         "--no-progress", "--out", out / "solved"], "solved", "solved/config.json"),
    "jacobian": Case(lambda i, out: ["jacobian", i.lm, "--length", "6", "--count", "1", "--coordinates", "4",
                                     "--no-progress", "--out", out / "out"], *record("jacobian")),
}


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command, its option strings) for every command that runs."""
    children = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not children:
        yield " ".join(path), {option for action in parser._actions for option in action.option_strings}
    for action in children:
        for name, child in action.choices.items():
            yield from leaf_commands(child, (*path, name))


def run(capsys, argv: list) -> tuple[int, list[str]]:
    code = main([str(arg) for arg in argv])
    return code, capsys.readouterr().err.strip().splitlines()


def plant(case: Case, out: Path) -> None:
    """Finished work at the case's target: a file of it, in a folder where the target is one."""
    marker = out / case.marker
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_bytes(MARKER)


def stranger(case: Case, out: Path) -> Path:
    """A user's file beside the case's finished work, which no command writes."""
    return (out / case.marker).parent / "notes.txt"


def contents(path: Path) -> dict[str, bytes]:
    """Every file and folder under ``path`` (or ``path`` itself, a file), with its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else b"/" for p in sorted(path.rglob("*"))}


def assert_one_line(lines: list[str], code: int, expected: int, *fragments: str) -> None:
    assert code == expected and len(lines) == 1 and lines[0].startswith("implicitlm: error:"), (code, lines)
    assert all(fragment in lines[0] for fragment in fragments), lines


@pytest.fixture
def workdir(inputs, monkeypatch):
    # lm-eval asks git about the folder it runs in: one outside any repository, and not the one written.
    monkeypatch.chdir(inputs.root / "cwd")


def test_every_command_that_writes_has_a_case_and_an_overwrite_flag():
    commands = dict(leaf_commands(build_parser()))
    writers = {name for name, options in commands.items() if "--out" in options}
    # A case named "COMMAND --task TASK" is that command on another task than the words.
    assert writers == {name.split(" --")[0] for name in CASES}, "a command that writes needs its case here"
    assert set(commands) - writers == READ_ONLY, "a command that writes without --out needs its case here"
    assert all("--overwrite" in commands[name] for name in writers)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_finished_work_is_refused_unless_overwrite(name, inputs, tmp_path, capsys, workdir):
    """--overwrite replaces what the command writes and no more (before: models import, the
    demos, solver train, catbabi build and sample deleted the folder whole)."""
    case = CASES[name]
    plant(case, tmp_path)
    stranger(case, tmp_path).write_bytes(MARKER)
    before = contents(tmp_path)
    code, err = run(capsys, case.argv(inputs, tmp_path))
    assert_one_line(err, code, 2, "--overwrite")
    assert contents(tmp_path) == before
    code, err = run(capsys, [*case.argv(inputs, tmp_path), "--overwrite"])
    assert code == 0, err
    marker = tmp_path / case.marker
    assert not marker.exists() or marker.read_bytes() != MARKER
    assert (tmp_path / case.target).exists()
    assert stranger(case, tmp_path).read_bytes() == MARKER


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_target_another_process_writes_is_refused(name, inputs, tmp_path, capsys, workdir):
    case = CASES[name]
    plant(case, tmp_path)
    with case.hold(tmp_path / case.target):
        before = contents(tmp_path)
        code, err = run(capsys, [*case.argv(inputs, tmp_path), "--overwrite"])
        assert_one_line(err, code, 2, "another")
        assert contents(tmp_path) == before


# The writers that build their whole --out folder: with --overwrite they replace their own kind
# of folder, and refuse any other.
WHOLE_FOLDERS = ("demo", "lm demo", "models import", "solver train", "catbabi build", "catbabi sample", "corpus build")


def other_kind(kind: str, inputs: SimpleNamespace, target: Path) -> None:
    """At ``target``, what a writer of a whole folder must not take for its own."""
    if kind == "a file":
        target.write_bytes(MARKER)
    elif kind == "a user's folder":
        target.mkdir()
        (target / "notes.txt").write_bytes(MARKER)
    else:
        source = {"token shards": inputs.shards, "a tokenizer": inputs.root / "tokenizer", "a run": inputs.words_run,
                  "a run's checkpoint": latest_checkpoint(inputs.words_run), "a catbAbI build": inputs.catbabi}[kind]
        shutil.copytree(source, target, symlinks=True)


@pytest.mark.parametrize("kind", ["a file", "a user's folder", "token shards", "a tokenizer", "a run", "a run's checkpoint",
                                  "a catbAbI build"])
@pytest.mark.parametrize("name", WHOLE_FOLDERS)
def test_a_folder_of_another_kind_is_refused_even_with_overwrite(name, kind, inputs, tmp_path, capsys, workdir):
    """before: models import (and the other writers of a whole folder) --overwrite deleted
    the folder whole, whatever it held; corpus build wrote its shards beside another's files."""
    case = CASES[name]
    if (name, kind) in {("corpus build", "token shards"), ("catbabi build", "a catbAbI build")}:
        pytest.skip("a folder of the writer's own kind")
    target = tmp_path / case.target
    other_kind(kind, inputs, target)
    before = contents(tmp_path)
    for overwrite in ([], ["--overwrite"]):
        code, err = run(capsys, [*case.argv(inputs, tmp_path), *overwrite])
        assert_one_line(err, code, 2, str(target), "not a folder" if kind == "a file" else "other work than")
        assert contents(tmp_path) == before


@pytest.mark.parametrize("name", ["generate", "words generate"])
def test_a_folder_where_a_file_is_written_is_refused_naming_it(name, inputs, tmp_path, capsys, workdir):
    """before: generate --out FOLDER --overwrite named a temporary file beside it
    (".text.txt.8r28uchi.tmp: Is a directory")."""
    case = CASES[name]
    (tmp_path / case.target).mkdir()
    (tmp_path / case.target / "notes.txt").write_bytes(MARKER)
    before = contents(tmp_path)
    code, err = run(capsys, [*case.argv(inputs, tmp_path), "--overwrite"])
    assert_one_line(err, code, 2, f"{tmp_path / case.target}: ")
    assert ".tmp" not in err[0] and contents(tmp_path) == before


@pytest.mark.parametrize("kind", ["a pipe", "a link"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pipe_or_a_link_at_the_target_is_refused_even_with_overwrite(name, kind, inputs, tmp_path, capsys, workdir):
    """before: --overwrite renamed a file over a pipe (or a device node), or over a link;
    a folder's writers wrote through a link (tokenizer train, lm eval)."""
    case = CASES[name]
    target = tmp_path / case.target
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a pipe":
        os.mkfifo(target)
    else:
        plant(case, tmp_path / "elsewhere")
        target.symlink_to(tmp_path / "elsewhere" / case.target)
    before = contents(tmp_path)
    for overwrite in ([], ["--overwrite"]):
        code, err = run(capsys, [*case.argv(inputs, tmp_path), *overwrite])
        assert_one_line(err, code, 2, f"{target}: {'not a file or a folder' if kind == 'a pipe' else 'a symbolic link'}")
        assert contents(tmp_path) == before and target.is_fifo() == (kind == "a pipe")


def copied_run(inputs: SimpleNamespace, tmp_path: Path) -> Path:
    return Path(shutil.copytree(inputs.words_run, tmp_path / "run", symlinks=True))


@pytest.mark.parametrize("place", ["a saved model", "a run's latest link", "a run's checkpoint"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_nothing_is_written_inside_a_saved_model_or_a_runs_checkpoint(name, place, inputs, tmp_path, capsys, workdir):
    """before: an evaluation wrote its record into the checkpoint (exit 0), which the run's
    next --resume pruned with it, or beside a shipped model's weights."""
    run_dir = copied_run(inputs, tmp_path)
    folder = {"a saved model": lambda: Path(shutil.copytree(inputs.lm, tmp_path / "model")),
              "a run's latest link": lambda: run_dir / LATEST, "a run's checkpoint": lambda: latest_checkpoint(run_dir)}
    inside = folder[place]()
    before = contents(tmp_path)
    code, err = run(capsys, [*CASES[name].argv(inputs, inside), "--overwrite"])
    what = "a saved model" if place == "a saved model" else "a training run's checkpoint"
    assert_one_line(err, code, 2, f"inside {what} ({inside.resolve()})")
    assert contents(tmp_path) == before


def test_an_evaluation_writes_its_record_beside_a_runs_checkpoints(inputs, tmp_path, capsys):
    """A run folder is no saved model (it links its newest checkpoint's config): its own
    entries are refused as targets, not the folder."""
    run_dir = copied_run(inputs, tmp_path)
    assert main(["words", "eval", str(run_dir), "--lengths", "6", "--count", "4", "--no-progress",
                 "--out", str(run_dir)]) == 0
    assert json.loads((run_dir / "word_length.json").read_text())["experiment"] == "word_length"


@pytest.mark.parametrize("entry", ["config.json", "metrics.jsonl", "checkpoints"])
def test_a_runs_own_entries_are_no_target(entry, inputs, tmp_path, capsys):
    """before: generate --out RUN/config.json --overwrite replaced the run's link to its latest
    checkpoint's config with the text, and --resume was refused."""
    run_dir = copied_run(inputs, tmp_path)
    before = contents(tmp_path)
    code, err = run(capsys, ["generate", inputs.lm, "--prompt", "the cat", "--max-new-tokens", "2", "--seed", "0",
                             "--out", run_dir / entry, "--overwrite"])
    what = {"config.json": "a symbolic link", "metrics.jsonl": "a training run's own metrics.jsonl",
            "checkpoints": "a training run's checkpoints"}[entry]
    assert_one_line(err, code, 2, f"{run_dir / entry}: {what}")
    assert contents(tmp_path) == before


@pytest.mark.parametrize("out", ["the checkpoint", "a copy of it"])
def test_a_solver_into_the_run_checkpoint_it_reads_is_refused_saying_what_is_no_models(out, inputs, tmp_path, capsys):
    """before: solver train CK --out CK --overwrite listed the model's own files (config.json,
    model.safetensors, ...) as "no part of a saved model"."""
    checkpoint = latest_checkpoint(copied_run(inputs, tmp_path))
    target = checkpoint if out == "the checkpoint" else Path(shutil.copytree(checkpoint, tmp_path / "copy"))
    before = contents(tmp_path)
    code, err = run(capsys, ["solver", "train", target, "--steps", "1", "--batch-size", "1", "--no-progress",
                             "--out", target, "--overwrite"])
    if out == "the checkpoint":
        assert_one_line(err, code, 2, f"{target}: inside a training run's checkpoints ({checkpoint.parent})")
    else:
        assert_one_line(err, code, 2, f"{target}: holds other work than a saved model (training_state.pt); ")
    assert contents(tmp_path) == before


def test_a_refused_evaluation_leaves_what_another_command_wrote_in_its_out(inputs, tmp_path, capsys, monkeypatch):
    """before: words eval, refused after it had made --out, removed --out whole, with the words
    that words generate (exit 0) had written there meanwhile."""
    out = tmp_path / "out"
    command = ["words", "eval", inputs.words_run, "--lengths", "6", "--out", out, "--no-progress"]

    def refused(*args, **kwargs):
        raise OptionError("a length whose words take more than a day")

    def meanwhile(*args, **kwargs):
        assert main(["words", "generate", "--group", "S3", "--length", "4", "--count", "3",
                     "--out", str(out / "train_words.npy")]) == 0
        refused()

    monkeypatch.setattr(WordsTask, "prepare", refused)
    code, err = run(capsys, command)
    assert_one_line(err, code, 2, "more than a day")
    assert not out.exists()  # the folder it made for its record, empty, is removed
    monkeypatch.setattr(WordsTask, "prepare", meanwhile)
    code, err = run(capsys, command)
    assert_one_line(err, code, 2, "more than a day")
    assert sorted(os.listdir(out)) == ["train_words.npy", "train_words.npy.json"]


def full_disk_under(root: Path, monkeypatch) -> None:
    """Every rename into ``root`` fails as on a full disk: a writer's last step, which
    commits its work."""
    for name in ("replace", "rename"):
        def full(source, destination, *args, real=getattr(os, name), **kwargs):
            if Path(os.fspath(destination)).absolute().is_relative_to(root):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(destination))
            return real(source, destination, *args, **kwargs)

        monkeypatch.setattr(os, name, full)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_full_disk_fails_in_one_line_and_leaves_the_earlier_target(name, inputs, tmp_path, capsys, monkeypatch,
                                                                     workdir):
    case = CASES[name]
    plant(case, tmp_path)
    before = contents(tmp_path)
    full_disk_under(tmp_path, monkeypatch)
    code, err = run(capsys, [*case.argv(inputs, tmp_path), "--overwrite"])
    monkeypatch.undo()
    assert_one_line(err, code, 1, os.strerror(errno.ENOSPC))
    assert contents(tmp_path) == before  # no temporaries, no lock, the earlier work as it was


# ---------------------------------------------------------------- the cases users met


@pytest.fixture
def checkpoint(inputs, tmp_path) -> Path:
    """A copy of a finished run's checkpoint."""
    return Path(shutil.copytree(latest_checkpoint(inputs.words_run), tmp_path / "checkpoint"))


@pytest.mark.parametrize("out", ["model.safetensors", "config"])  # config: config.json its .npy's sidecar
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_generate_onto_a_checkpoint_keeps_its_weights_and_config(out, overwrite, checkpoint, capsys):
    """before: the words replaced model.safetensors (or, as the .npy's sidecar, config.json), exit 0."""
    before = contents(checkpoint)
    code, err = run(capsys, ["words", "generate", "--group", "S3", "--length", "4", "--count", "3",
                             "--out", checkpoint / out, *overwrite])
    assert_one_line(err, code, 2, f"{checkpoint / out}: inside a saved model ({checkpoint})")
    assert contents(checkpoint) == before


def test_a_tokenizer_trained_onto_a_checkpoint_leaves_its_tokenizer(inputs, tmp_path, capsys):
    """before: tokenizer.json of the language model replaced by one of another vocabulary, exit 0."""
    model = Path(shutil.copytree(inputs.lm, tmp_path / "lm"))
    before = contents(model)
    code, err = run(capsys, ["tokenizer", "train", inputs.root / "corpus.txt", "--vocab-size", "300", "--out", model])
    assert_one_line(err, code, 2, str(model), "--overwrite")
    assert contents(model) == before
    assert main(["tokenizer", "train", str(inputs.root / "corpus.txt"), "--vocab-size", "300", "--out", str(model),
                 "--overwrite"]) == 0
    assert len(load_tokenizer(model)) == 300 and (model / "model.safetensors").read_bytes() == before["model.safetensors"]


@pytest.mark.slow
def test_a_report_into_the_run_it_reads_keeps_the_evaluations_figure(inputs, tmp_path, capsys):
    """before: report RUN --out RUN replaced RUN/word_length.png, the evaluation's own figure."""
    run_dir = tmp_path / "run"
    assert main(["words", "eval", str(inputs.words_run), "--lengths", "6", "--count", "4", "--no-progress",
                 "--out", str(run_dir)]) == 0
    capsys.readouterr()
    before = contents(run_dir)
    code, err = run(capsys, ["report", run_dir, "--out", run_dir])
    assert_one_line(err, code, 2, "word_length.png", "--overwrite")
    assert contents(run_dir) == before
    assert main(["report", str(run_dir), "--out", str(run_dir), "--overwrite"]) == 0
    assert (run_dir / "report.md").is_file() and (run_dir / "word_length.png").read_bytes() != before["word_length.png"]


@pytest.mark.parametrize("existing", ["a file", "a record"])
def test_an_evaluation_refuses_its_output_before_it_evaluates(existing, inputs, tmp_path, capsys, monkeypatch):
    """before: words eval --out EXISTING_FILE ran the whole evaluation, then failed on the
    output, its results neither written nor printed."""
    out = tmp_path / "out"
    if existing == "a file":
        out.write_bytes(MARKER)
    else:
        out.mkdir()
        (out / "word_length.json").write_bytes(MARKER)
    prepared = []
    monkeypatch.setattr(WordsTask, "prepare", lambda *args, **kwargs: prepared.append(args) or pytest.fail("evaluated"))
    code, err = run(capsys, ["words", "eval", inputs.words_run, "--lengths", "6", "--count", "4", "--out", out])
    assert_one_line(err, code, 2, str(out))
    assert prepared == [] and contents(out) == ({"out": MARKER} if existing == "a file" else {"word_length.json": MARKER})


@pytest.mark.parametrize("change, field", [
    ({"curves": [{"label": "simultaneous mode", "x": [6, 12], "y": "oops"}]}, "'curves[0].y'"),
    ({"metrics": {"accuracy@6": "oops"}}, "'metrics.accuracy@6'"),
    ({"model": "oops"}, "'model'"),
    ({"curves": [{"label": "simultaneous mode", "x": [6, 12], "y": [0.5]}]}, "'curves[0].y'"),
    ({"axes": {"x": "length", "xscale": "oops"}}, "'axes.xscale'"),
    ({"experiment": "../escaped"}, "'experiment'"),
])
def test_a_result_file_with_a_bad_field_is_named_with_the_field(change, field, tmp_path, capsys):
    """before: "'oops' is not a valid format string", an AttributeError traceback, or, for an
    experiment named "../escaped", its figure written outside --out."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({**GOOD_RECORD, **change}))
    code, err = run(capsys, ["report", results, "--out", tmp_path / "report"])
    assert_one_line(err, code, 2, str(results), field, "oops" if "oops" in json.dumps(change) else "")
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


# The writers whose --out is a folder: run in it as "." (the current folder).
FOLDER_CASES = {name: case for name, case in CASES.items() if Path(case.target).suffix == "" or "/" in case.target}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FOLDER_CASES))
def test_a_writer_given_the_current_folder_as_out_writes_it(name, inputs, tmp_path, monkeypatch, capsys):
    """Before: a ValueError ("PosixPath('.') has an empty name") from most; corpus build and
    solver train replaced the current folder, then read it back as "." (a folder no longer
    there): "No such file or directory", exit 2, after writing it."""
    case = FOLDER_CASES[name]
    argv = [str(arg) for arg in case.argv(inputs, tmp_path)]
    folder = Path(argv[argv.index("--out") + 1])
    folder.mkdir()
    argv[argv.index("--out") + 1] = "."
    for again in ([], ["--overwrite"]):  # into the empty folder, then over its own work there
        monkeypatch.chdir(folder)  # by its name: a writer replaces the folder by a rename
        code, err = run(capsys, [*argv, *again])
        assert code == 0, (again, err)
        assert (tmp_path / case.marker).is_file()
