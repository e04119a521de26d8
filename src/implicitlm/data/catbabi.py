"""catbAbI (Schlag et al. 2021): the 20 bAbI v1.2 tasks as one language-modelling stream.

Reading. A folder of bAbI v1.2 task files named ``qaN_{train,valid,test}.txt`` (the en-valid
and en-valid-10k folders) or ``qaN_<name>_{train,test}.txt`` (the en and en-10k folders, which
have no valid split: there the last tenth of each task's training stories is held out as
valid, the 90/10 split en-valid and en-valid-10k made of the same files). Lines are "ID text";
the ID restarts at 1 where a story begins; question lines are "ID question?<TAB>answer<TAB>
supporting line ids".

The stream. Each story is lower-cased and cut into tokens: its words, "." after each fact,
"?" after each question and then the answer as one token (``lamp,kite`` and ``n,w`` stay
whole). The stories of all tasks of a split are shuffled (seeded, per split) and
concatenated, each followed by an eos token. The model learns it as a language model and is
scored on the answer tokens, each predicted from the "?" before it.

The folder ``build_catbabi`` writes, which ``implicitlm train --data`` accepts::

    index.json, train/, test/, eval/   token shards (implicitlm.data.shards). Shard split
                                       "train" is bAbI train, "test" is bAbI valid (the
                                       held-out split the trainer reports) and "eval" is
                                       bAbI test (see SHARD_SPLITS)
    tokenizer/                         the word-level tokenizer (Hugging Face format)
    answers.npz                        per bAbI split: ``{split}_positions``, where in the
                                       shard split each answer token is, and ``{split}_tasks``
    catbabi.json                       source, tasks, seed and counts

The folder is built under a temporary name beside ``out_dir`` and renamed into place once
complete, so a failed build leaves no half-written folder and a replaced one intact.

The vocabulary is closed: every token of every split (the requested tasks), sorted, after
the eos and unk tokens.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from implicitlm.core.atomic_io import atomic_write, staged_directory, write_json
from implicitlm.core.targets import FolderKind, exclusive_target
from implicitlm.core.errors import DataError, OptionError, first_line, quoted
from implicitlm.core.json_file import read_utf8
from implicitlm.data.shard_writer import PROGRESS_FILE, write_token_streams
from implicitlm.data.shards import INDEX_FILE, TokenShards
from implicitlm.data.tokenizer import EOS_TOKEN, PADDING_SIDE, load_tokenizer, save_tokenizer

TASKS = tuple(range(1, 21))
SPLITS = ("train", "valid", "test")
# bAbI split -> shard split. The trainer reports held-out perplexity on shard split "test";
# that must be bAbI valid, so that bAbI test stays untouched until the final evaluation.
SHARD_SPLITS = {"train": "train", "valid": "test", "test": "eval"}
TASK_FILE = re.compile(r"^qa(\d+)_(?:.*_)?(train|valid|test)\.txt$")
UNK_TOKEN = "<unk>"
TOKENIZER_DIR = "tokenizer"
ANSWERS_FILE = "answers.npz"
SUMMARY_FILE = "catbabi.json"
# What a build writes into its folder, which its summary marks.
CATBABI_FOLDER = FolderKind("a catbAbI build", marks=(SUMMARY_FILE,), entries=(
    INDEX_FILE, PROGRESS_FILE, TOKENIZER_DIR, ANSWERS_FILE, SUMMARY_FILE, *SHARD_SPLITS.values()
))
# Of each task's training stories, the share a folder without valid files holds out as valid.
HELD_OUT_SHARE = 0.1
# Line ids of more digits are refused: no story is that long, and int() refuses thousands.
MAX_ID_DIGITS = 9


@dataclass(frozen=True)
class Fact:
    words: tuple[str, ...]  # lower-cased, without the final "."


@dataclass(frozen=True)
class Question:
    words: tuple[str, ...]  # lower-cased, without the final "?"
    answer: str
    supporting: tuple[int, ...]  # line ids of the facts the answer rests on


@dataclass(frozen=True)
class Story:
    task: int
    lines: tuple[Fact | Question, ...]
    source: str  # "file:line" of its first line

    def tokens(self) -> tuple[list[str], list[int]]:
        """The story's stream tokens, and the indices of its answers among them."""
        tokens: list[str] = []
        answers: list[int] = []
        for line in self.lines:
            if isinstance(line, Question):
                tokens += [*line.words, "?"]
                answers.append(len(tokens))
                tokens.append(line.answer)
            else:
                tokens += [*line.words, "."]
        return tokens, answers


@dataclass(frozen=True)
class Answers:
    """The answers of one split of a built folder, in stream order."""

    positions: np.ndarray  # int64: index of each answer token in its shard split
    tasks: np.ndarray  # the bAbI task (1-20) of each answer


# ---------------------------------------------------------------- reading bAbI files


def read_babi(
    folder: str | os.PathLike,
    tasks: Sequence[int] | None = None,
    splits: Sequence[str] = SPLITS,
) -> dict[str, list[Story]]:
    """The stories of ``tasks`` (default all 20) per split, in task order then file order.
    A folder without valid files holds out valid from train (``holds_out_valid``)."""
    stories: dict[str, list[Story]] = {split: [] for split in splits}
    held_out = "valid" in splits and holds_out_valid(folder)
    wanted = (set(splits) - {"valid"}) | {"train"} if held_out else set(splits)
    for (task, split), path in find_task_files(folder, tasks, [s for s in SPLITS if s in wanted]).items():
        task_stories = read_task_file(path, task)
        if held_out and split == "train":
            cut = len(task_stories) - max(1, round(HELD_OUT_SHARE * len(task_stories)))
            if cut < 1:
                raise DataError(f"{path}: {len(task_stories)} stories, too few to hold out valid ones from")
            stories["valid"] += task_stories[cut:]
            task_stories = task_stories[:cut]
        if split in stories:
            stories[split] += task_stories
    return stories


def holds_out_valid(folder: str | os.PathLike) -> bool:
    """True for a folder with no valid file at all (bAbI's en and en-10k), whose valid stories
    are therefore the last tenth of each task's training file."""
    folder = Path(folder)
    if not folder.is_dir():
        return False  # find_task_files names the missing folder
    return not any((match := TASK_FILE.match(path.name)) and match[2] == "valid" for path in folder.iterdir())


def find_task_files(
    folder: str | os.PathLike,
    tasks: Sequence[int] | None = None,
    splits: Sequence[str] = SPLITS,
) -> dict[tuple[int, str], Path]:
    """The file of each (task, split) in ``folder``; a DataError names any that is missing."""
    folder = Path(folder)
    wanted = check_tasks(tasks)
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise OptionError(f"unknown bAbI split(s) {unknown}; the splits are {list(SPLITS)}")
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder of bAbI task files")
    found: dict[tuple[int, str], Path] = {}
    for path in sorted(folder.iterdir()):
        match = TASK_FILE.match(path.name)
        if not match:
            continue
        key = (int(match[1]), match[2])
        if key[0] not in TASKS:
            raise DataError(f"{path}: task {key[0]} is not a bAbI task (1-20)")
        if key in found:
            raise DataError(
                f"{folder}: two files for task {key[0]} {key[1]}: {found[key].name} and {path.name}"
            )
        found[key] = path
    missing = {split: [task for task in wanted if (task, split) not in found] for split in splits}
    if any(missing.values()):
        raise DataError(_missing_message(folder, missing, subset=tasks is not None))
    return {(task, split): found[task, split] for task in wanted for split in splits}


def check_tasks(tasks: Sequence[int] | None) -> list[int]:
    """``tasks`` as a sorted list of bAbI task ids (all 20 for None); OptionError if invalid."""
    if tasks is None:
        return list(TASKS)
    invalid = [task for task in tasks if task not in TASKS]
    if invalid or not tasks or len(set(tasks)) != len(tasks):
        raise OptionError(f"tasks must be distinct bAbI task ids 1-20, got {tasks}")
    return sorted(tasks)


def _missing_message(folder: Path, missing: dict[str, list[int]], subset: bool) -> str:
    parts = [
        f"no {split} file (qaN_{split}.txt or qaN_<name>_{split}.txt) for task(s) "
        + ", ".join(map(str, tasks))
        for split, tasks in missing.items()
        if tasks
    ]
    hint = "" if subset else "; pass tasks (--tasks) to use a subset"
    if missing.get("valid"):
        hint += "; catbAbI needs the en-valid or en-valid-10k folder of bAbI v1.2"
    return f"{folder}: {'; '.join(parts)}{hint}"


def read_task_file(path: str | os.PathLike, task: int) -> list[Story]:
    """The stories of one bAbI task file; a DataError names the file and line of any fault."""
    path = Path(path)
    stories: list[Story] = []
    lines: list[Fact | Question] = []
    start = previous_id = 0
    text = read_utf8(path, "a bAbI task file")
    for number, raw in enumerate(text.split("\n"), 1):
        raw = raw.rstrip("\r")
        if not raw.strip():
            continue
        line_id, line = parse_line(raw, f"{path}:{number}")
        if line_id == 1:
            if lines:
                stories.append(_story(task, lines, f"{path}:{start}"))
            lines, start = [], number
        elif line_id != previous_id + 1:
            raise DataError(
                f"{path}:{number}: expected line id {previous_id + 1} (or 1 to begin a story), got {line_id}"
            )
        lines.append(line)
        previous_id = line_id
    if not lines:
        raise DataError(f"{path}: no stories")
    stories.append(_story(task, lines, f"{path}:{start}"))
    return stories


def parse_line(raw: str, where: str) -> tuple[int, Fact | Question]:
    """One line of a task file: its id, and the fact or question it holds."""
    line_id, space, text = raw.partition(" ")
    if not _is_line_id(line_id) or not space:
        raise DataError(f"{where}: expected 'ID text' with a positive integer ID, got {quoted(raw)}")
    fields = [field.strip() for field in text.lower().split("\t")]
    if len(fields) == 1:
        return int(line_id), Fact(_sentence_words(fields[0], ".", where))
    if len(fields) != 3:
        raise DataError(
            f"{where}: expected a fact, or 'question?<TAB>answer<TAB>supporting ids', "
            f"got {len(fields)} tab-separated fields"
        )
    question, answer, supporting = fields
    if not answer or len(answer.split()) != 1:
        raise DataError(f"{where}: expected the answer as one word (a list as 'a,b'), got {quoted(answer)}")
    if not all(_is_line_id(part) for part in supporting.split()):
        raise DataError(f"{where}: expected supporting line ids as integers, got {quoted(supporting)}")
    words = _sentence_words(question, "?", where)
    return int(line_id), Question(words, answer, tuple(int(part) for part in supporting.split()))


def _is_line_id(text: str) -> bool:
    # str.isdigit alone accepts other scripts' digits, which int() may refuse.
    return text.isascii() and text.isdigit() and len(text) <= MAX_ID_DIGITS and int(text) >= 1


def _sentence_words(sentence: str, end: str, where: str) -> tuple[str, ...]:
    if not sentence.endswith(end) or not sentence[:-1].split():
        kind = "fact" if end == "." else "question"
        raise DataError(f"{where}: expected a {kind} ending in {end!r}, got {quoted(sentence)}")
    return tuple(sentence[:-1].split())


def _story(task: int, lines: list[Fact | Question], source: str) -> Story:
    if not any(isinstance(line, Question) for line in lines):
        raise DataError(f"{source}: the story that begins here asks no question")
    return Story(task, tuple(lines), source)


# ---------------------------------------------------------------- the stream


def shuffled_stories(stories: Sequence[Story], seed: int, split: str) -> list[Story]:
    """``stories`` in the stream's order: a permutation drawn from (seed, split)."""
    order = np.random.default_rng([seed, SPLITS.index(split)]).permutation(len(stories))
    return [stories[i] for i in order]


def vocabulary(stories: dict[str, list[Story]]) -> list[str]:
    """eos, unk, then every token of every split, sorted: the same for the same stories."""
    words = {token for split in stories.values() for story in split for token in story.tokens()[0]}
    return [EOS_TOKEN, UNK_TOKEN, *sorted(words)]


def word_tokenizer(words: Sequence[str]) -> PreTrainedTokenizerFast:
    """A tokenizer that splits lower-cased text on whitespace and looks the words up."""
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=UNK_TOKEN))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN,
                                   padding_side=PADDING_SIDE)


def encode_stream(
    stories: Sequence[Story], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[np.ndarray], Answers]:
    """Each story's token ids, and where its answers fall in the stream of the stories, each
    followed by eos (the layout ``write_token_streams`` gives)."""
    documents, positions, tasks = [], [], []
    offset = 0
    for story in stories:
        tokens, answers = story.tokens()
        documents.append(np.array(tokenizer.convert_tokens_to_ids(tokens), dtype=np.uint32))
        positions += [offset + answer for answer in answers]
        tasks += [story.task] * len(answers)
        offset += len(tokens) + 1
    return documents, Answers(np.array(positions, dtype=np.int64), np.array(tasks, dtype=np.int64))


def build_catbabi(
    babi_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    tasks: Sequence[int] | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read bAbI from ``babi_dir`` and write the catbAbI folder ``out_dir`` (see the module
    docstring); returns its summary (what catbabi.json holds)."""
    out_dir = Path(out_dir)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptionError(f"seed must be a non-negative integer, got {seed!r}")
    with exclusive_target(out_dir, overwrite, CATBABI_FOLDER):
        stories = read_babi(babi_dir, tasks)
        with staged_directory(out_dir, CATBABI_FOLDER.keeps) as staging:
            summary = _write_catbabi(stories, babi_dir, staging, out_dir, tasks, seed)
    return summary


def _write_catbabi(
    stories: dict[str, list[Story]],
    babi_dir: str | os.PathLike,
    out_dir: Path,
    final_dir: Path,
    tasks: Sequence[int] | None,
    seed: int,
) -> dict[str, Any]:
    """Write the folder into ``out_dir``, which becomes ``final_dir`` once complete."""
    save_tokenizer(word_tokenizer(vocabulary(stories)), out_dir / TOKENIZER_DIR)
    tokenizer = load_tokenizer(out_dir / TOKENIZER_DIR)
    # The shard index records where the tokenizer is: where it will be, not where it is built.
    tokenizer.name_or_path = str(final_dir / TOKENIZER_DIR)
    documents, answers = {}, {}
    for split, split_stories in stories.items():
        stream = shuffled_stories(split_stories, seed, split)
        documents[SHARD_SPLITS[split]], answers[split] = encode_stream(stream, tokenizer)
    write_token_streams(documents, tokenizer, out_dir, overwrite=True)
    _write_answers(out_dir / ANSWERS_FILE, answers)
    summary = {
        "source": str(babi_dir),
        "valid": "last tenth of each task's train file" if holds_out_valid(babi_dir) else "the valid files",
        "tasks": check_tasks(tasks),
        "seed": seed,
        "vocab_size": len(tokenizer),
        "shard_splits": SHARD_SPLITS,
        "splits": {split: _split_summary(stories[split], answers[split]) for split in SPLITS},
    }
    write_json(out_dir / SUMMARY_FILE, summary)
    return summary


def _split_summary(stories: list[Story], answers: Answers) -> dict[str, Any]:
    tasks, counts = np.unique(answers.tasks, return_counts=True)
    return {
        "stories": len(stories),
        "answers": len(answers.positions),
        "answers_per_task": {str(task): int(count) for task, count in zip(tasks, counts)},
    }


def _write_answers(path: Path, answers: dict[str, Answers]) -> None:
    arrays = {}
    for split, split_answers in answers.items():
        arrays[f"{split}_positions"] = split_answers.positions
        arrays[f"{split}_tasks"] = split_answers.tasks

    def write(temporary: Path) -> None:
        # A file object: given a name, numpy would add ".npz" to the temporary one.
        with temporary.open("wb") as handle:
            np.savez(handle, **arrays)

    atomic_write(path, write)


def read_answers(data_dir: str | os.PathLike, split: str) -> Answers:
    """The answers of bAbI split ``split`` of a folder that ``build_catbabi`` wrote."""
    data_dir = Path(data_dir)
    if split not in SPLITS:
        raise OptionError(f"unknown bAbI split {split!r}; the splits are {list(SPLITS)}")
    if not (data_dir / SUMMARY_FILE).is_file():
        raise DataError(f"{data_dir}: no {SUMMARY_FILE}; build the folder with `implicitlm catbabi build`")
    path = data_dir / ANSWERS_FILE
    try:
        with np.load(path, allow_pickle=False) as arrays:
            answers = Answers(arrays[f"{split}_positions"], arrays[f"{split}_tasks"])
    # numpy and zipfile report a damaged archive in many ways, depending on the fault.
    except Exception as error:
        raise DataError(f"{path}: unreadable ({first_line(error)}); build the folder again") from None
    _check_answers(path, split, answers, len(TokenShards(data_dir, SHARD_SPLITS[split])))
    return answers


def _check_answers(path: Path, split: str, answers: Answers, stream_length: int) -> None:
    positions, tasks = answers.positions, answers.tasks
    if (
        positions.ndim != 1
        or positions.shape != tasks.shape
        or positions.dtype.kind not in "iu"
        or tasks.dtype.kind not in "iu"
    ):
        raise DataError(
            f"{path}: expected {split} answer positions and tasks as integer vectors of one length, "
            f"got {positions.dtype} {positions.shape} and {tasks.dtype} {tasks.shape}"
        )
    if positions.size and (
        positions.min() < 1 or positions.max() >= stream_length or np.any(np.diff(positions) <= 0)
    ):
        raise DataError(
            f"{path}: expected increasing {split} answer positions in [1, {stream_length}), "
            f"the length of its shard split"
        )
    if tasks.size and not np.isin(tasks, TASKS).all():
        raise DataError(f"{path}: expected {split} answer tasks among the bAbI tasks 1-20")
