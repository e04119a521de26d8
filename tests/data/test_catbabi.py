"""catbAbI: parsing bAbI files, the stream and its shards, answer accuracy, the commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from implicitlm.cli import main
from implicitlm.data.babi_sample import SAMPLE_TASKS, write_babi_sample
from implicitlm.data.catbabi import (
    SHARD_SPLITS,
    SPLITS,
    Fact,
    Question,
    build_catbabi,
    read_answers,
    read_babi,
    read_task_file,
)
from implicitlm.core.errors import DataError
from implicitlm.core.targets import TargetExistsError
from implicitlm.data.shards import TokenShards
from implicitlm.data.tokenizer import load_tokenizer
from implicitlm.tasks.catbabi import answer_accuracy, window_starts

from tests.support.stubs import ExplicitStub

# Answers per task in the sample's train split.
TRAIN_ANSWERS = {1: 4, 6: 2, 8: 4, 15: 2, 19: 2}


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return write_babi_sample(tmp_path_factory.mktemp("babi"))


@pytest.fixture(scope="module")
def built(sample, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("catbabi")
    build_catbabi(sample, out, tasks=SAMPLE_TASKS, seed=0, overwrite=True)
    return out


def stream_tokens(folder: Path, split: str) -> list[str]:
    shards = TokenShards(folder, SHARD_SPLITS[split])
    return load_tokenizer(folder / "tokenizer").convert_ids_to_tokens(shards.read(0, len(shards)).tolist())


def data_error(function, *args, **kwargs) -> str:
    with pytest.raises(DataError) as caught:
        function(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return str(caught.value)


# ---------------------------------------------------------------- parsing


def test_parser_finds_story_question_and_answer_boundaries(sample):
    stories = read_task_file(sample / "qa1_train.txt", 1)
    assert len(stories) == 2 and [s.source for s in stories] == [f"{sample / 'qa1_train.txt'}:{n}" for n in (1, 7)]
    first = stories[0]
    assert first.task == 1 and len(first.lines) == 6
    assert first.lines[0] == Fact(("ada", "walked", "to", "the", "garden"))
    assert first.lines[2] == Question(("where", "is", "ada"), "garden", (1,))
    tokens, answers = first.tokens()
    assert tokens[:13] == "ada walked to the garden . bruno went to the cellar . where".split()
    assert tokens[13:17] == ["is", "ada", "?", "garden"]
    assert [tokens[i] for i in answers] == ["garden", "attic"] and answers == [16, len(tokens) - 1]
    assert all(tokens[i - 1] == "?" for i in answers)


def test_list_and_path_answers_stay_one_token(sample):
    lists = [line.answer for story in read_task_file(sample / "qa8_train.txt", 8) for line in story.lines
             if isinstance(line, Question)]
    paths = [story.tokens()[0][-1] for story in read_task_file(sample / "qa19_train.txt", 19)]
    assert lists == ["lamp", "lamp,kite", "kite", "kite,lamp"]
    assert paths == ["n,w", "e,n"]


def test_stories_carry_their_task_ids(sample):
    stories = read_babi(sample, tasks=SAMPLE_TASKS)
    assert list(stories) == list(SPLITS)
    assert [s.task for s in stories["train"]] == [1, 1, 6, 8, 8, 15, 19, 19]
    assert [s.task for s in stories["test"]] == list(SAMPLE_TASKS)
    assert [s.task for s in read_babi(sample, tasks=[19, 8])["valid"]] == [8, 19]


def test_original_file_names_read_the_same(sample, tmp_path):
    names = {1: "single-supporting-fact", 6: "yes-no-questions", 8: "lists-sets", 15: "basic-deduction",
             19: "path-finding"}
    for task, name in names.items():
        for split in ("train", "test"):
            shutil.copy(sample / f"qa{task}_{split}.txt", tmp_path / f"qa{task}_{name}_{split}.txt")
    long_names = read_babi(tmp_path, tasks=SAMPLE_TASKS, splits=("train", "test"))
    short_names = read_babi(sample, tasks=SAMPLE_TASKS, splits=("train", "test"))
    for split in ("train", "test"):
        assert [(s.task, s.lines) for s in long_names[split]] == [(s.task, s.lines) for s in short_names[split]]
    # No valid files at all (bAbI's en folders): the last tenth of each task's train stories,
    # at least one, and never all of them.
    counts = {task: sum(s.task == task for s in short_names["train"]) for task in SAMPLE_TASKS}
    several = [task for task in SAMPLE_TASKS if counts[task] > 1]
    assert len(several) >= 3
    assert "too few to hold out valid ones from" in data_error(read_babi, tmp_path, tasks=SAMPLE_TASKS)
    held_out = read_babi(tmp_path, tasks=several)
    for task in several:
        train = [s.lines for s in short_names["train"] if s.task == task]
        cut = len(train) - max(1, round(0.1 * len(train)))
        assert [s.lines for s in held_out["train"] if s.task == task] == train[:cut]
        assert [s.lines for s in held_out["valid"] if s.task == task] == train[cut:]
    assert [s.task for s in held_out["valid"]] == sorted(s.task for s in held_out["valid"])


def test_missing_task_files_are_named(sample, tmp_path):
    shutil.copytree(sample, tmp_path, dirs_exist_ok=True)
    (tmp_path / "qa8_valid.txt").unlink()
    message = data_error(read_babi, tmp_path, tasks=SAMPLE_TASKS)
    assert "no valid file" in message and "task(s) 8" in message and "train" not in message
    everything = data_error(read_babi, sample)  # all 20 tasks by default
    assert "task(s) 2, 3, 4, 5, 7, 9" in everything and "--tasks" in everything
    assert "no such folder" in data_error(read_babi, tmp_path / "nowhere")


def test_two_files_for_one_task_and_split_are_refused(sample, tmp_path):
    shutil.copytree(sample, tmp_path, dirs_exist_ok=True)
    shutil.copy(sample / "qa1_train.txt", tmp_path / "qa1_single-supporting-fact_train.txt")
    assert "two files for task 1 train" in data_error(read_babi, tmp_path, tasks=SAMPLE_TASKS)


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("3 Where is Ada\tgarden\t1", "ending in '?'"),
        ("3 Ada went home", "ending in '.'"),
        ("three Ada went home.", "positive integer ID"),
        ("5 Ada went home.", "expected line id 3"),
        ("3 Where is Ada?\tthe garden\t1", "answer as one word"),
        ("3 Where is Ada?\tgarden", "tab-separated fields"),
        ("3 Where is Ada?\tgarden\tone", "supporting line ids"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, fragment):
    path = tmp_path / "qa1_train.txt"
    path.write_text(f"1 Ada walked to the garden.\n2 Where is Ada?\tgarden\t1\n{line}\n")
    message = data_error(read_task_file, path, 1)
    assert message.startswith(f"{path}:3: ") and fragment in message


def test_a_story_without_a_question_is_refused(tmp_path):
    path = tmp_path / "qa1_test.txt"
    path.write_text("1 Ada walked to the garden.\n2 Where is Ada?\tgarden\t1\n1 Bruno ran to the porch.\n")
    assert data_error(read_task_file, path, 1).startswith(f"{path}:3: ")


# ---------------------------------------------------------------- the stream and its folder


def test_stream_is_deterministic_by_seed_and_answers_follow_question_marks(sample, built, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    build_catbabi(sample, again, tasks=SAMPLE_TASKS, seed=0)
    build_catbabi(sample, other, tasks=SAMPLE_TASKS, seed=1)
    stories = read_babi(sample, tasks=SAMPLE_TASKS)
    for split in SPLITS:
        tokens = stream_tokens(built, split)
        assert tokens == stream_tokens(again, split)
        answers = read_answers(built, split)
        assert np.array_equal(answers.positions, read_answers(again, split).positions)
        assert all(tokens[p - 1] == "?" for p in answers.positions)
        assert tokens.count("?") == len(answers.positions)
        # The same answers of the same tasks, in the stream's order.
        parsed = sorted((s.task, line.answer) for s in stories[split] for line in s.lines if isinstance(line, Question))
        assert sorted(zip(answers.tasks.tolist(), [tokens[p] for p in answers.positions])) == parsed
        assert tokens.count("<|endoftext|>") == len(stories[split]) and tokens[-1] == "<|endoftext|>"
    assert stream_tokens(other, "train") != stream_tokens(built, "train")
    assert sorted(stream_tokens(other, "train")) == sorted(stream_tokens(built, "train"))


def test_the_folder_is_token_shards_with_a_closed_word_vocabulary(sample, built):
    tokenizer = load_tokenizer(built / "tokenizer")
    words = {t for split in read_babi(sample, tasks=SAMPLE_TASKS).values() for s in split for t in s.tokens()[0]}
    assert len(tokenizer) == len(words) + 2  # eos and unk
    assert tokenizer.convert_ids_to_tokens([0, 1]) == ["<|endoftext|>", "<unk>"]
    # Saved padding where generation continues each row, as every tokenizer here.
    assert json.loads((built / "tokenizer" / "tokenizer_config.json").read_text())["padding_side"] == "left"
    assert tokenizer("Where is Ada ? n,w")["input_ids"] == tokenizer.convert_tokens_to_ids(
        ["where", "is", "ada", "?", "n,w"]
    )
    for split in SPLITS:
        shards = TokenShards(built, SHARD_SPLITS[split], verify=True)
        assert shards.vocab_size == len(tokenizer) and shards.eos_token_id == tokenizer.eos_token_id
        assert 1 not in shards.read(0, len(shards))  # no unknown word
    assert "apple,lamp" in stream_tokens(built, "test") and "apple,lamp" not in stream_tokens(built, "valid")
    summary = json.loads((built / "catbabi.json").read_text())
    assert summary["splits"]["train"]["answers_per_task"] == {str(t): n for t, n in TRAIN_ANSWERS.items()}
    with pytest.raises(TargetExistsError, match="overwrite=True$"):
        build_catbabi(sample, built, tasks=SAMPLE_TASKS)


# ---------------------------------------------------------------- answer accuracy


@pytest.mark.parametrize("length, stride", [(16, 4), (16, 16), (40, 13), (1000, 7)])
def test_windows_score_each_answer_with_the_promised_context(length, stride):
    rng = np.random.default_rng(length + stride)
    stream_length = 300
    positions = np.sort(rng.choice(np.arange(1, stream_length), size=60, replace=False))
    starts = window_starts(positions, stream_length, length, stride)
    window = min(length, stream_length)
    assert np.all(starts >= 0) and np.all(starts + window <= stream_length)
    assert np.all(starts <= positions - 1) and np.all(positions <= starts + window)
    assert np.all(positions - starts >= np.minimum(positions, window - stride + 1))


class OracleStub(ExplicitStub, torch.nn.Module):
    """Predicts the stream's next token where it is the answer of one of ``tasks`` and the
    window gives it ``min_context`` tokens (or all the stream before it); eos elsewhere."""

    def __init__(self, stream: np.ndarray, positions: np.ndarray, tasks: np.ndarray, right: set[int],
                 vocab_size: int, min_context: int):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(vocab_size=vocab_size)
        self.stream, self.vocab_size, self.min_context = stream, vocab_size, min_context
        self.answerable = {int(p) for p, t in zip(positions, tasks) if t in right}
        self.calls = []

    def forward(self, input_ids, mode, max_iter, tol, fixed_point=None):
        self.calls.append((mode, max_iter, tol))
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab_size)
        logits[..., 0] = 1.0
        windows = sliding_window_view(self.stream, length)
        for row, ids in enumerate(input_ids.numpy()):
            (start,) = np.flatnonzero((windows == ids).all(axis=1))  # the window is unique
            for i in range(length):
                target = start + i + 1
                if target in self.answerable and (i + 1 >= self.min_context or start == 0):
                    logits[row, i] = 0.0
                    logits[row, i, self.stream[target]] = 1.0
        return SimpleNamespace(logits=logits, fixed_point=None)


@pytest.mark.parametrize("length, stride", [(16, 4), (24, 24)])
def test_accuracy_per_task_of_a_model_with_known_answers(built, length, stride):
    shards = TokenShards(built, "train")
    answers = read_answers(built, "train")
    model = OracleStub(shards.read(0, len(shards)).astype(np.int64), answers.positions, answers.tasks,
                       right={1, 8, 19}, vocab_size=shards.vocab_size, min_context=length - stride + 1)
    result = answer_accuracy(model, built, "train", length, stride, mode="sequential", max_iter=3, tol=0.5,
                             batch_size=3)
    assert {task: row["answers"] for task, row in result["tasks"].items()} == TRAIN_ANSWERS
    assert {task: row["accuracy"] for task, row in result["tasks"].items()} == {1: 1.0, 6: 0.0, 8: 1.0, 15: 0.0,
                                                                                19: 1.0}
    assert result["accuracy"] == pytest.approx(10 / 14) and result["answers"] == 14
    assert result["stride"] == stride and len(model.calls) == -(-result["windows"] // 3)
    assert set(model.calls) == {("sequential", 3, 0.5)}
    model.config.vocab_size -= 1
    with pytest.raises(ValueError, match="more than the model's"):
        answer_accuracy(model, built, "train", length, stride)


# ---------------------------------------------------------------- the commands


@pytest.mark.slow
def test_sample_build_train_and_eval_commands_chain(tmp_path, capsys):
    babi, data, run, out = (tmp_path / name for name in ("babi", "data", "run", "out"))
    assert main(["catbabi", "sample", "--out", str(babi)]) == 0
    assert main(["catbabi", "build", str(babi), "--out", str(data)]) == 2
    assert "--tasks" in capsys.readouterr().err
    assert main(["catbabi", "build", str(babi), "--out", str(data), "--tasks", "1,6,8,15,19", "--seed", "3"]) == 0
    assert "train: 8 stories, 14 answers" in capsys.readouterr().out
    model = ["hidden_size=16", "num_hidden_layers=1", "state_size=8", "head_dim=8", "chunk_size=16"]
    train = ["sequence_length=16", "batch_size=4", "batch_tokens=64", "total_steps=2", "checkpoint_every=2",
             "warmup_steps=1", "bounded_fraction=0.5", "free_max_iter=4", "free_phantom_steps=2", "eval_every=2",
             "eval_batches=1", "log_every=1"]
    options = [arg for m in model for arg in ("--model", m)] + [arg for t in train for arg in ("--train", t)]
    assert main(["train", "--data", str(data), "--out", str(run), "--no-progress", *options]) == 0
    checkpoint = run / "checkpoints" / "step_0000002"
    assert main(["lm", "eval", str(checkpoint), "--data", str(data), "--split", "eval", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["catbabi", "eval", str(checkpoint), "--data", str(data), "--sequence-length", "16",
                 "--max-iter", "4", "--solver", "safeguarded_anderson", "--out", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "accuracy" in table and "all" in table
    record = json.loads((out / "catbabi.json").read_text())
    assert record["model"]["solvers"] == {"simultaneous": "safeguarded_anderson", "sequential": "safeguarded_anderson"}
    assert record["experiment"] == "catbabi" and record["split"] == "test" and record["answers"] == 6
    assert set(record["metrics"]) == {"accuracy", "task_01", "task_06", "task_08", "task_15", "task_19",
                                      "fp_passes_mean", "fp_not_converged_share"}
    assert 0.0 <= record["metrics"]["accuracy"] <= 1.0 and record["stride"] == 8
    assert (out / "catbabi.png").stat().st_size > 1000
