"""catbAbI (Schlag et al. 2021): the 20 bAbI v1.2 tasks as one language-modelling stream.

Reading. A folder of bAbI v1.2 task files named ``qaN_{train,valid,test}.txt`` (the en-valid
and en-valid-10k folders) or ``qaN_<name>_{train,test}.txt`` (the en and en-10k folders, which
have no valid split). Lines are "ID text"; the ID restarts at 1 where a story begins;
question lines are "ID question?<TAB>answer<TAB>supporting line ids".

The stream. Each story is lower-cased and cut into tokens: its words, "." after each fact,
"?" after each question and then the answer as one token (``lamp,kite`` and ``n,w`` stay
whole). The stories of all tasks of a split are shuffled (seeded, per split) and
concatenated, each followed by an eos token. The model learns it as a language model and is
scored on the answer tokens, each predicted from the "?" before it.

The folder ``build_catbabi`` writes, which ``implicitlm train --data`` accepts::

    index.json, train/, test/, eval/   token shards (implicitlm.data.shards). Shard split
                                       "train" is bAbI train, "test" is bAbI valid (the
                                       held-out split the LM trainer reports) and "eval" is
                                       bAbI test (see SHARD_SPLITS)
    tokenizer/                         the word-level tokenizer (Hugging Face format)
    answers.npz                        per bAbI split: ``{split}_positions``, where in the
                                       shard split each answer token is, and ``{split}_tasks``
    catbabi.json                       source, tasks, seed and counts; written last, so a
                                       folder with it is complete

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

from implicitlm.atomic_io import atomic_write, write_json
from implicitlm.data.errors import DataError
from implicitlm.data.shards import INDEX_FILE, write_token_streams
from implicitlm.data.tokenizer import EOS_TOKEN, load_tokenizer, save_tokenizer

TASKS = tuple(range(1, 21))
SPLITS = ("train", "valid", "test")
# bAbI split -> shard split. The LM trainer reports held-out perplexity on shard split "test";
# that must be bAbI valid, so that bAbI test stays untouched until the final evaluation.
SHARD_SPLITS = {"train": "train", "valid": "test", "test": "eval"}
TASK_FILE = re.compile(r"^qa(\d+)_(?:.*_)?(train|valid|test)\.txt$")
UNK_TOKEN = "<unk>"
TOKENIZER_DIR = "tokenizer"
ANSWERS_FILE = "answers.npz"
SUMMARY_FILE = "catbabi.json"


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
    """The stories of ``tasks`` (default all 20) per split, in task order then file order."""
    stories: dict[str, list[Story]] = {split: [] for split in splits}
    for (task, split), path in find_task_files(folder, tasks, splits).items():
        stories[split] += read_task_file(path, task)
    return stories


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
        raise ValueError(f"unknown bAbI split(s) {unknown}; the splits are {list(SPLITS)}")
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
    """``tasks`` as a sorted list of bAbI task ids (all 20 for None); ValueError if invalid."""
    if tasks is None:
        return list(TASKS)
    invalid = [task for task in tasks if task not in TASKS]
    if invalid or not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be distinct bAbI task ids 1-20, got {tasks}")
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
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
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
    if not line_id.isdigit() or int(line_id) < 1 or not space:
        raise DataError(f"{where}: expected 'ID text' with a positive integer ID, got {raw[:60]!r}")
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
        raise DataError(f"{where}: expected the answer as one word (a list as 'a,b'), got {answer!r}")
    if not all(part.isdigit() for part in supporting.split()):
        raise DataError(f"{where}: expected supporting line ids as integers, got {supporting!r}")
    words = _sentence_words(question, "?", where)
    return int(line_id), Question(words, answer, tuple(int(part) for part in supporting.split()))


def _sentence_words(sentence: str, end: str, where: str) -> tuple[str, ...]:
    if not sentence.endswith(end) or not sentence[:-1].split():
        kind = "fact" if end == "." else "question"
        raise DataError(f"{where}: expected a {kind} ending in {end!r}, got {sentence[:60]!r}")
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
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN)


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
    # Refused before anything is written, so that a finished folder is left whole.
    if (out_dir / INDEX_FILE).exists() and not overwrite:
        raise DataError(f"{out_dir}: holds built shards; pass overwrite=True (--overwrite) to replace them")
    stories = read_babi(babi_dir, tasks)
    (out_dir / SUMMARY_FILE).unlink(missing_ok=True)  # the folder is incomplete until the end
    save_tokenizer(word_tokenizer(vocabulary(stories)), out_dir / TOKENIZER_DIR)
    tokenizer = load_tokenizer(out_dir / TOKENIZER_DIR)
    documents, answers = {}, {}
    for split, split_stories in stories.items():
        stream = shuffled_stories(split_stories, seed, split)
        documents[SHARD_SPLITS[split]], answers[split] = encode_stream(stream, tokenizer)
    write_token_streams(documents, tokenizer, out_dir, overwrite=True)
    _write_answers(out_dir / ANSWERS_FILE, answers)
    summary = {
        "source": str(babi_dir),
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
        raise ValueError(f"unknown bAbI split {split!r}; the splits are {list(SPLITS)}")
    if not (data_dir / SUMMARY_FILE).is_file():
        raise DataError(f"{data_dir}: no {SUMMARY_FILE}; build the folder with `implicitlm catbabi build`")
    try:
        with np.load(data_dir / ANSWERS_FILE, allow_pickle=False) as arrays:
            return Answers(arrays[f"{split}_positions"], arrays[f"{split}_tasks"])
    except (OSError, KeyError, ValueError) as error:
        raise DataError(f"{data_dir / ANSWERS_FILE}: unreadable ({error}); build the folder again") from None
