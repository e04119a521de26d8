"""Every data parser: written data reads back equal, and damaged files give one-line errors.

Round trips draw valid data with hypothesis, write it with the project's writer and read
it back. Corruption tests damage the files of a valid layout (truncate, flip, insert,
splice in awkward tokens, rewrite a JSON field, replace a file by a folder...) and accept
only two outcomes: the data parse, or a ValueError / FileNotFoundError with a one-line
message naming the folder of the damaged file. The fuzzing run (test_fuzz_parsers.py)
drives the same targets and mutations from a seeded random generator.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from implicitlm.core.atomic_io import write_json
from implicitlm.presets import load_preset
from implicitlm.presets.run_presets import SECTION_NAMES
from implicitlm.data import catbabi, shard_writer, tokenizer as tokenizer_module, word_csv, word_storage, words
from implicitlm.data.babi_sample import SAMPLE_TASKS, write_babi_sample
from implicitlm.data.catbabi import (
    SPLITS, Fact, Question, build_catbabi, read_answers, read_babi, read_task_file, word_tokenizer,
)
from implicitlm.data.corpus import read_documents
from implicitlm.core.errors import DataError
from implicitlm.core.targets import TargetExistsError
from implicitlm.data.groups import get_group
from implicitlm.data.shard_writer import write_shards, write_token_streams
from implicitlm.data.shards import TokenShards
from implicitlm.data.tokenizer import EOS_TOKEN, load_tokenizer, save_tokenizer
from implicitlm.data.word_storage import load_words, save_words, sidecar_path, write_generated_words
from implicitlm.data.words import generate_words, prefix_products

# ---------------------------------------------------------------- parse targets


class Injected(Exception):
    """A failure injected into a writer."""


@dataclass(frozen=True)
class Target:
    """A parser and a valid layout of its files: ``build`` writes the layout into an empty
    folder, ``parse`` reads all of it; ``files`` (relative) are the ones to damage."""

    name: str
    build: Callable[[Path], None]
    parse: Callable[[Path], Any]
    files: tuple[str, ...]


def _build_words_csv(folder: Path) -> None:
    inputs, targets = generate_words("S3", length=5, count=4, seed=1)
    save_words(folder / "w.csv", inputs, targets, {"group": "S3", "seed": 1})


def _parse_words_csv(folder: Path) -> None:
    data = load_words(folder / "w.csv", group="S3")
    assert data.inputs.shape == data.targets.shape


def _build_words_npy(folder: Path) -> None:
    inputs, targets = generate_words("A4xZ2", length=6, count=5, seed=2)
    save_words(folder / "w.npy", inputs, targets, {"group": "A4xZ2", "seed": 2})


def _parse_words_npy(folder: Path) -> None:
    data = load_words(folder / "w.npy")
    assert np.array(data.inputs).shape == np.array(data.targets).shape


def _build_words_derived(folder: Path) -> None:
    write_generated_words(folder / "d.bin", "A5xM", length=7, count=3, seed=3, hard_prob=0.5, targets="derived")


def _parse_words_derived(folder: Path) -> None:
    data = load_words(folder / "d.bin")
    assert data.targets[:].shape == data.inputs.shape


def _build_babi(folder: Path) -> None:
    write_babi_sample(folder)
    for path in folder.iterdir():
        if not path.name.startswith("qa1_"):
            path.unlink()


def _parse_babi(folder: Path) -> None:
    read_babi(folder, tasks=[1])


def _build_catbabi(folder: Path) -> None:
    with tempfile.TemporaryDirectory() as babi:
        build_catbabi(write_babi_sample(babi), folder, tasks=SAMPLE_TASKS, overwrite=True)


def _parse_catbabi(folder: Path) -> None:
    for split in SPLITS:
        read_answers(folder, split)


def _build_jsonl(folder: Path) -> None:
    lines = [json.dumps({"text": text, "n": i}) for i, text in enumerate(["ab c", "ü\n", "", "x" * 40])]
    (folder / "docs.jsonl").write_text("\n".join(lines) + "\n\n")


def _build_parquet(folder: Path) -> None:
    pq.write_table(pa.table({"text": ["one", "two ü", ""], "id": [1, 2, 3]}), folder / "docs.parquet")


def _build_text(folder: Path) -> None:
    (folder / "doc.txt").write_bytes("plain\r\ntext ü\n".encode())


def _read_all(path: str) -> Callable[[Path], None]:
    return lambda folder: list(read_documents(folder / path))


def small_tokenizer() -> Any:
    return word_tokenizer([EOS_TOKEN, "<unk>", "a", "b", "c", "d"])


def _build_tokenizer(folder: Path) -> None:
    save_tokenizer(small_tokenizer(), folder / "tok")


def _parse_tokenizer(folder: Path) -> None:
    load_tokenizer(folder / "tok")


def _build_shards(folder: Path) -> None:
    documents = {"train": [np.array([2, 3, 4]), np.array([5] * 9)], "test": [np.array([4, 3])]}
    write_token_streams(documents, small_tokenizer(), folder, shard_tokens=8)


def _parse_shards(folder: Path) -> None:
    for split in ("train", "test"):
        shards = TokenShards(folder, split, verify=split == "test")
        shards.read(0, len(shards))


RESUMED_TEXTS = [f"a b {'c ' * i}d" for i in range(12)]
RESUME_SETTINGS = {"shard_tokens": 8, "test_fraction": 0.3, "seed": 1, "progress": False}


def _build_interrupted_shards(folder: Path) -> None:
    def killed() -> Any:
        yield from RESUMED_TEXTS[:9]
        raise Injected("killed")

    with pytest.raises(Injected):
        write_shards(killed(), small_tokenizer(), folder / "run", batch_documents=1, **RESUME_SETTINGS)


def _resume_shards(folder: Path) -> None:
    """Resume a copy of the interrupted run (resuming writes), then read what it wrote."""
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(folder / "run", work)
    write_shards(RESUMED_TEXTS, small_tokenizer(), work, resume=True, **RESUME_SETTINGS)
    _parse_shards(work)


def _build_preset(folder: Path) -> None:
    write_json(folder / "p.json", {"train": {"group": "S3", "steps": 3, "lr": 1e-3}, "model": {"layers": [1, 2]}})


TARGETS = [
    Target("words-csv", _build_words_csv, _parse_words_csv, ("w.csv",)),
    Target("words-npy", _build_words_npy, _parse_words_npy, ("w.npy", "w.npy.json")),
    Target("words-derived", _build_words_derived, _parse_words_derived, ("d.bin", "d.bin.json")),
    Target("babi", _build_babi, _parse_babi, ("qa1_train.txt", "qa1_valid.txt", "qa1_test.txt")),
    Target("catbabi-answers", _build_catbabi, _parse_catbabi, ("answers.npz",)),
    Target("corpus-jsonl", _build_jsonl, _read_all("docs.jsonl"), ("docs.jsonl",)),
    Target("corpus-parquet", _build_parquet, _read_all("docs.parquet"), ("docs.parquet",)),
    Target("corpus-text", _build_text, _read_all("doc.txt"), ("doc.txt",)),
    Target("tokenizer", _build_tokenizer, _parse_tokenizer, ("tok/tokenizer.json", "tok/tokenizer_config.json")),
    Target("shards", _build_shards, _parse_shards, ("index.json", "train/shard_00000.bin", "test/shard_00000.bin")),
    Target(
        "shards-resume",
        _build_interrupted_shards,
        _resume_shards,
        ("run/progress.json", "run/train/shard_00000.bin", "run/train/shard_00001.bin"),
    ),
    Target("preset", _build_preset, lambda folder: load_preset(str(folder / "p.json")), ("p.json",)),
]


# ---------------------------------------------------------------- mutations


class Chooser(Protocol):
    """The source of a mutation's choices: hypothesis draws or a seeded generator."""

    def integer(self, low: int, high: int) -> int: ...

    def raw(self, size: int) -> bytes: ...


class DrawChooser:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def raw(self, size: int) -> bytes:
        return self.data.draw(st.binary(min_size=size, max_size=size))


class RngChooser:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high + 1))

    def raw(self, size: int) -> bytes:
        return self.rng.bytes(size)


# Byte strings that parsers find awkward: encodings, separators, numbers past every limit.
AWKWARD_BYTES = [
    b"", b"\x00", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\n", b"\r", b"\t", b",", b'"', b" ",
    b"-1", b"0", b"1e999", b"NaN", b"9" * 5000, b"18446744073709551616", b"[", b"]", b"{", b"}",
    b"null", b"\xe2\x80\xa8", b"\xc2\xb2", b"\xef\xbb\xbf", b"../../", b"PK\x03\x04", b"\x93NUMPY",
]
# JSON values for a rewritten field: wrong types, signs, sizes and nesting.
AWKWARD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 7, 2**64, 10**400, 1.5, -0.0, 1e308, "", "x", "uint8", "float32",
    "uint16", "S3", "Q8", "A5xM", "derived", "../../etc/passwd", "train/shard_00000.bin", [], [1, -2],
    {}, {"file": "x"}, [[[[[]]]]], {"a": {"b": None}},
]


def mutate_bytes(data: bytes, choose: Chooser) -> bytes:
    """One random damage to ``data``."""
    size = len(data)
    at = choose.integer(0, size)
    op = choose.integer(0, 7)
    if op == 0:  # truncate
        return data[:at]
    if op == 1:  # flip a few bytes
        damaged = bytearray(data)
        for _ in range(choose.integer(1, 4)):
            if damaged:
                damaged[choose.integer(0, size - 1)] ^= choose.integer(1, 255)
        return bytes(damaged)
    if op == 2:  # insert random bytes
        return data[:at] + choose.raw(choose.integer(1, 16)) + data[at:]
    if op == 3:  # delete a span
        return data[:at] + data[at + choose.integer(1, 32) :]
    if op == 4:  # repeat a span
        span = data[at : at + choose.integer(1, 64)]
        return data[:at] + span * choose.integer(2, 3) + data[at:]
    if op == 5:  # splice in an awkward token
        token = AWKWARD_BYTES[choose.integer(0, len(AWKWARD_BYTES) - 1)]
        return data[:at] + token + data[at + choose.integer(0, 8) :]
    if op == 6:  # random bytes
        return choose.raw(choose.integer(0, 64))
    return b""


def mutate_json(value: Any, choose: Chooser) -> Any:
    """``value`` with one field, somewhere inside, deleted or replaced by an awkward value."""
    containers = []

    def walk(node: Any) -> None:
        if isinstance(node, dict) and node:
            containers.append(node)
        if isinstance(node, list) and node:
            containers.append(node)
        for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
            walk(child)

    walk(value)
    if not containers:
        return AWKWARD_VALUES[choose.integer(0, len(AWKWARD_VALUES) - 1)]
    node = containers[choose.integer(0, len(containers) - 1)]
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    key = keys[choose.integer(0, len(keys) - 1)]
    if choose.integer(0, 4) == 0:
        del node[key]
    else:
        node[key] = AWKWARD_VALUES[choose.integer(0, len(AWKWARD_VALUES) - 1)]
    return value


def rewrite(path: Path, data: bytes) -> None:
    # Unlinking first: truncating a file in place is far slower on some file systems.
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def damage(path: Path, choose: Chooser) -> str:
    """Damage the file at ``path`` in place; returns what was done, to reproduce a failure."""
    data = path.read_bytes()
    kind = choose.integer(0, 19)
    if kind == 0:
        path.unlink()
        path.mkdir()
        return "replaced by a folder"
    if kind == 1:
        path.unlink()
        return "deleted"
    if kind <= 7:
        try:
            value = json.loads(data)
        except ValueError:
            value = None
        if value is not None:
            text = json.dumps(mutate_json(value, choose))
            rewrite(path, text.encode())
            return f"JSON field rewritten: {text[:200]}"
    damaged = mutate_bytes(data, choose)
    rewrite(path, damaged)
    return f"bytes damaged: {len(data)} -> {len(damaged)} bytes"


def restore(path: Path, original: bytes) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    rewrite(path, original)


def check_outcome(target: Target, folder: Path, what: str) -> str:
    """Parse ``folder``: "parsed", or "refused" with a one-line error naming the folder;
    any other exception fails the test."""
    try:
        target.parse(folder)
    except (ValueError, FileNotFoundError) as error:
        message = str(error)
        assert "\n" not in message and "\r" not in message, f"{target.name} ({what}): {message!r}"
        assert str(folder) in message, f"{target.name} ({what}): message names no file: {message!r}"
        return "refused"
    return "parsed"


class Layout:
    """A valid layout of ``target`` in a fresh folder, its files damaged and restored in turn."""

    def __init__(self, target: Target, root: Path) -> None:
        self.target = target
        self.folder = root / target.name
        self.folder.mkdir(parents=True)
        target.build(self.folder)
        self.originals = {name: (self.folder / name).read_bytes() for name in target.files}

    def trial(self, choose: Chooser) -> str:
        """Damage one or two of the files, parse, and restore them; returns the outcome."""
        damaged: dict[str, str] = {}
        try:
            for _ in range(choose.integer(1, 2)):
                name = self.target.files[choose.integer(0, len(self.target.files) - 1)]
                if (self.folder / name).is_file():
                    done = damage(self.folder / name, choose)
                    damaged[name] = f"{damaged[name]}, then {done}" if name in damaged else done
            what = "; ".join(f"{name}: {done}" for name, done in damaged.items())
            return check_outcome(self.target, self.folder, what)
        finally:
            for name in damaged:
                restore(self.folder / name, self.originals[name])


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Layout]:
    root = tmp_path_factory.mktemp("layouts")
    return {target.name: Layout(target, root) for target in TARGETS}


@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.name)
def test_valid_layouts_parse(target: Target, layouts: dict[str, Layout]) -> None:
    assert check_outcome(target, layouts[target.name].folder, "undamaged") == "parsed"


CORRUPTION = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.name)
@CORRUPTION
@given(data=st.data())
def test_damaged_files_parse_or_give_one_line_errors(
    target: Target, layouts: dict[str, Layout], data: st.DataObject
) -> None:
    layouts[target.name].trial(DrawChooser(data))


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.name)
@CORRUPTION
@given(content=st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_give_one_line_errors(
    target: Target, layouts: dict[str, Layout], content: bytes
) -> None:
    layout = layouts[target.name]
    for name in target.files:
        path = layout.folder / name
        rewrite(path, content)
        try:
            check_outcome(target, layout.folder, f"{name} = {content!r}")
        finally:
            restore(path, layout.originals[name])


# ---------------------------------------------------------------- round trips

ROUND_TRIP = settings(max_examples=25, deadline=None)
WORD_GROUPS = ["S3", "A4", "Z5", "M", "S3xZ2", "A5xM", "Z1", "Z300"]


@ROUND_TRIP
@given(
    group=st.sampled_from(WORD_GROUPS),
    count=st.integers(1, 6),
    length=st.integers(1, 9),
    seed=st.integers(0, 2**63),
    filename=st.sampled_from(["w.csv", "w.npy", "w.bin"]),
)
def test_saved_words_read_back_equal(group: str, count: int, length: int, seed: int, filename: str) -> None:
    algebra = get_group(group)
    inputs = np.random.default_rng(seed).integers(0, algebra.order, size=(count, length))
    targets = prefix_products(algebra, inputs)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / filename
        save_words(path, inputs, targets, {"group": group, "seed": seed})
        data = load_words(path, group=group)
        np.testing.assert_array_equal(data.inputs, inputs)
        np.testing.assert_array_equal(data.targets, targets)
        assert data.group == algebra.name and data.meta["seed"] == seed
        assert (data.meta["count"], data.meta["length"]) == (count, length)


@ROUND_TRIP
@given(
    group=st.sampled_from(["S3xZ2", "A5xM", "MxZ3"]),
    count=st.integers(1, 5),
    length=st.integers(1, 12),
    seed=st.integers(0, 2**32),
    hard_prob=st.one_of(st.none(), st.floats(0.0, 1.0)),
    storage=st.sampled_from(["stored", "derived"]),
)
def test_generated_word_files_read_back_the_generated_words(
    group: str, count: int, length: int, seed: int, hard_prob: float | None, storage: str
) -> None:
    inputs, targets = generate_words(group, length, count, seed, hard_prob)
    with tempfile.TemporaryDirectory() as folder:
        written = write_generated_words(Path(folder) / "g.npy", group, length, count, seed, hard_prob, targets=storage)
        np.testing.assert_array_equal(written.inputs, inputs)
        np.testing.assert_array_equal(np.asarray(written.targets), targets)
        assert written.meta["hard_prob"] == hard_prob and written.meta["seed"] == seed


WORD = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)


@st.composite
def stories(draw: st.DrawFn) -> list[list[Fact | Question]]:
    """bAbI stories: lower-case facts and questions, each story with a question."""
    result = []
    for _ in range(draw(st.integers(1, 3))):
        lines: list[Fact | Question] = []
        for _ in range(draw(st.integers(0, 3))):
            lines.append(Fact(tuple(draw(st.lists(WORD, min_size=1, max_size=5)))))
        answer = ",".join(draw(st.lists(WORD, min_size=1, max_size=2)))
        supporting = tuple(draw(st.lists(st.integers(1, len(lines) + 1), max_size=2)))
        lines.append(Question(tuple(draw(st.lists(WORD, min_size=1, max_size=5))), answer, supporting))
        result.append(lines)
    return result


def babi_text(story_lines: list[list[Fact | Question]]) -> str:
    rows = []
    for lines in story_lines:
        for number, line in enumerate(lines, 1):
            if isinstance(line, Question):
                ids = " ".join(map(str, line.supporting))
                rows.append(f"{number} {' '.join(line.words).capitalize()}?\t{line.answer}\t{ids}")
            else:
                rows.append(f"{number} {' '.join(line.words).capitalize()}.")
    return "\n".join(rows) + "\n"


@ROUND_TRIP
@given(story_lines=stories(), crlf=st.booleans())
def test_babi_files_read_back_their_stories(story_lines: list[list[Fact | Question]], crlf: bool) -> None:
    text = babi_text(story_lines)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "qa3_train.txt"
        path.write_bytes(text.replace("\n", "\r\n" if crlf else "\n").encode())
        read = read_task_file(path, 3)
    assert [list(story.lines) for story in read] == story_lines
    assert all(story.task == 3 for story in read)


TEXTS = st.lists(st.text(max_size=40), min_size=1, max_size=5)


@ROUND_TRIP
@given(texts=TEXTS)
def test_jsonl_parquet_and_text_files_read_back_their_documents(texts: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        jsonl, parquet, text = Path(folder) / "d.jsonl", Path(folder) / "d.parquet", Path(folder) / "d.txt"
        jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        pq.write_table(pa.table({"text": texts}), parquet)
        text.write_bytes(texts[0].encode())
        assert list(read_documents(jsonl)) == texts
        assert list(read_documents(parquet)) == texts
        assert list(read_documents(text)) == [texts[0]]


@settings(max_examples=15, deadline=None)
@given(vocabulary=st.lists(st.text("abcdefghijklmnopqrstuvwxyzäß0123456789,", min_size=1, max_size=8), max_size=20))
def test_saved_tokenizers_read_back_the_same_vocabulary(vocabulary: list[str]) -> None:
    words_ = [EOS_TOKEN, "<unk>", *sorted(set(vocabulary) - {"<unk>"})]
    tokenizer = word_tokenizer(words_)
    with tempfile.TemporaryDirectory() as folder:
        save_tokenizer(tokenizer, Path(folder) / "tok")
        loaded = load_tokenizer(Path(folder) / "tok")
        assert loaded.get_vocab() == tokenizer.get_vocab() and loaded.eos_token_id == 0
        tokens = words_[2:]
        assert loaded.convert_tokens_to_ids(tokens) == tokenizer.convert_tokens_to_ids(tokens)
        assert not [name for name in os.listdir(Path(folder) / "tok") if name.startswith(".")]


@ROUND_TRIP
@given(
    splits=st.dictionaries(
        st.sampled_from(["train", "test", "eval"]),
        st.lists(st.lists(st.integers(1, 5), max_size=12), max_size=4),
        min_size=1,
    ).filter(lambda splits: any(splits.values())),
    shard_tokens=st.integers(1, 9),
)
def test_token_streams_read_back_their_documents(splits: dict[str, list[list[int]]], shard_tokens: int) -> None:
    tokenizer = small_tokenizer()
    with tempfile.TemporaryDirectory() as folder:
        write_token_streams({k: [np.array(d) for d in v] for k, v in splits.items()}, tokenizer, folder, shard_tokens)
        for split, documents in splits.items():
            shards = TokenShards(folder, split, verify=True)
            expected = [token for document in documents for token in [*document, tokenizer.eos_token_id]]
            assert shards.read(0, len(shards)).tolist() == expected
            assert all(tokens <= shard_tokens for tokens in shards.shard_tokens)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=12,
)


@ROUND_TRIP
@given(preset=st.dictionaries(
    st.sampled_from(SECTION_NAMES), st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3), max_size=5,
))
def test_presets_read_back_equal(preset: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        write_json(Path(folder) / "p.json", preset)
        assert load_preset(str(Path(folder) / "p.json")) == preset


# ---------------------------------------------------------------- one-line errors for known faults


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"group": "S3", "count": -4, "length": 5, "format_version": 1}, "'count' to be an integer >= 1"),
        ({"group": "S3", "count": 4, "length": "5", "format_version": 1}, "'length' to be an integer"),
        ({"group": ["S3"], "count": 4, "length": 5, "format_version": 1}, "'group'"),
        ({"group": "S9", "count": 4, "length": 5, "format_version": 1}, "unknown group name"),
        ({"group": "S3", "count": 4, "length": 5, "format_version": True}, "format_version 1"),
        ({"group": "S3", "count": 4, "length": 5, "format_version": 1, "seed": -1}, "'seed'"),
        ({"group": "S3", "count": 4, "length": 5, "format_version": 1, "hard_prob": "x"}, "'hard_prob'"),
        ({"group": "S3", "count": 4, "length": 5, "format_version": 1, "targets": ["x"]}, "'targets'"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_word_metadata_fields_are_checked(tmp_path: Path, content: Any, fragment: str) -> None:
    inputs, targets = generate_words("S3", length=5, count=4)
    path = tmp_path / "w.npy"
    save_words(path, inputs, targets, {"group": "S3", "seed": 0})
    sidecar_path(path).write_text(json.dumps(content))
    with pytest.raises(DataError) as error:
        load_words(path)
    assert fragment in str(error.value) and str(sidecar_path(path)) in str(error.value)


def test_out_of_range_elements_in_a_word_file_are_refused(tmp_path: Path) -> None:
    inputs, targets = generate_words("S3", length=5, count=4)
    path = tmp_path / "w.npy"
    save_words(path, inputs, targets, {"group": "S3", "seed": 0})
    array = np.load(path, mmap_mode="r+")
    array[1, 2, 3] = 6  # S3 has elements 0-5
    array.flush()
    del array
    with pytest.raises(DataError, match="below 6 for S3, got 6 in words 0-3"):
        load_words(path)


def test_stored_labels_that_are_not_the_running_products_are_refused(tmp_path: Path) -> None:
    inputs, targets = generate_words("S3", length=5, count=4)
    path = tmp_path / "w.npy"
    save_words(path, inputs, targets, {"group": "S3", "seed": 0})
    array = np.load(path, mmap_mode="r+")
    array[1, 2, 3] = (array[1, 2, 3] + 1) % 6  # a valid element, but the wrong product
    array.flush()
    del array
    with pytest.raises(DataError, match="w.npy: word 2: the stored labels are not the running products"):
        load_words(path)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"seed,input,target\n0,1 2,1 \xff\n", "w.csv:2: expected UTF-8 text"),
        (b"\xef\xbb\xbfseed,input,target\n0,1 2,1 4\n", None),
        (b"seed,input,target\n0,1 2,1 4\n0,1 2,1 3\n", "w.csv: word 1: the stored labels are not the running products"),
        (b"seed,input,target\n0,1 " + b"9" * 5000 + b",1 3\n", "w.csv:2: expected input indices below 6"),
        (b"seed,input,target\n" + b"9" * 5000 + b",1 2,1 3\n", "w.csv:2: expected a non-negative integer seed"),
        (b"seed,input,target\n-3,1 2,1 3\n", "non-negative integer seed"),
        (b"seed,input,target\n0,\xc2\xb2 1,1 1\n", "non-negative integers in input"),
        (b'seed,input,target\n0,"1 2,1 3\n', "w.csv:"),
    ],
)
def test_csv_faults_name_the_line(tmp_path: Path, content: bytes, fragment: str | None) -> None:
    path = tmp_path / "w.csv"
    path.write_bytes(content)
    if fragment is None:
        assert load_words(path, group="S3").inputs.tolist() == [[1, 2]]
        return
    with pytest.raises(DataError) as error:
        load_words(path, group="S3")
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_shard_index_cannot_point_outside_its_folder(tmp_path: Path) -> None:
    _build_shards(tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    index["splits"]["train"]["shards"][0]["file"] = "../outside/shard_00000.bin"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match="'train/shard_NNNNN.bin'"):
        TokenShards(tmp_path, "train")


def test_a_token_id_past_the_vocabulary_is_refused_when_read(tmp_path: Path) -> None:
    _build_shards(tmp_path)
    shard = tmp_path / "train" / "shard_00000.bin"
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[3] = 6  # the vocabulary has 6 tokens
    tokens.tofile(shard)
    shards = TokenShards(tmp_path, "train")
    assert shards.read(0, 3).tolist() == [2, 3, 4]
    with pytest.raises(DataError, match="token id 6 at or after token 0 is not below the vocabulary size 6"):
        shards.read(0, 4)


def test_a_tokenizer_with_ids_past_its_length_is_refused(tmp_path: Path) -> None:
    _build_tokenizer(tmp_path)
    path = tmp_path / "tok" / "tokenizer.json"
    content = json.loads(path.read_text())
    content["model"]["vocab"]["c"] = 10**6
    path.write_text(json.dumps(content))
    with pytest.raises(DataError, match="expected token ids below the tokenizer's length"):
        load_tokenizer(tmp_path / "tok")


def test_answer_positions_past_the_stream_are_refused(tmp_path: Path) -> None:
    _build_catbabi(tmp_path)
    with np.load(tmp_path / "answers.npz") as arrays:
        answers = dict(arrays)
    answers["test_positions"] = answers["test_positions"] + 10**6
    with open(tmp_path / "answers.npz", "wb") as handle:
        np.savez(handle, **answers)
    assert len(read_answers(tmp_path, "train").positions) > 0
    with pytest.raises(DataError, match="expected increasing test answer positions"):
        read_answers(tmp_path, "test")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{\"a\": NaN}", "NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "nesting too deep"),
        ("{\"a\": " + "9" * 5000 + "}", "expected JSON (a preset)"),
        ("[1, 2]", "expected a JSON object (a preset), got list"),
    ],
)
def test_preset_faults_are_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(DataError) as error:
        load_preset(str(path))
    assert fragment in str(error.value) and str(path) in str(error.value)


def test_jsonl_faults_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"text": ' + "9" * 5000 + "}\n" + "[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: expected a JSON object"):
        list(read_documents(path))
    path.write_text('{"text": "ok"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: expected a JSON object, got nesting too deep"):
        list(read_documents(path))


def test_a_folder_in_place_of_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "w.npy").mkdir()
    with pytest.raises(DataError, match="expected a word file, got a directory"):
        load_words(tmp_path / "w.npy")
    (tmp_path / "qa1_train.txt").mkdir()
    with pytest.raises(DataError, match="expected a bAbI task file, got a directory"):
        read_task_file(tmp_path / "qa1_train.txt", 1)
    (tmp_path / "p.json").mkdir()
    with pytest.raises(DataError, match="expected a preset, got a directory"):
        load_preset(str(tmp_path / "p.json"))


# ---------------------------------------------------------------- atomic writers


def listing(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hidden ones included) and its bytes."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def fail_on_call(number: int, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, except that its ``number``-th call (1-based) raises ``Injected``."""
    calls = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == number:
            raise Injected(f"call {number}")
        return function(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("failing_call", [1, 2])
@pytest.mark.parametrize("filename", ["w.npy", "w.csv"])
def test_failed_word_writes_leave_the_old_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int, filename: str
) -> None:
    """Failing the array's or the sidecar's write leaves the old pair (no mixed pair)."""
    path = tmp_path / filename
    old_inputs, old_targets = generate_words("S3", length=4, count=3, seed=0)
    save_words(path, old_inputs, old_targets, {"group": "S3", "seed": 0})
    before = listing(tmp_path)
    new_inputs, new_targets = generate_words("S3", length=6, count=2, seed=1)
    writer = word_csv if filename == "w.csv" else word_storage  # the module that writes the format
    monkeypatch.setattr(writer, "atomic_write", fail_on_call(failing_call, writer.atomic_write))
    try:
        save_words(path, new_inputs, new_targets, {"group": "S3", "seed": 1})
    except Injected:
        pass
    monkeypatch.undo()
    if filename == "w.csv" and failing_call == 2:
        assert load_words(path, group="S3").inputs.tolist() == new_inputs.tolist()  # one file, one write
        return
    assert listing(tmp_path) == before
    np.testing.assert_array_equal(load_words(path, group="S3").inputs, old_inputs)


def test_writing_over_a_folder_is_refused(tmp_path: Path) -> None:
    inputs, targets = generate_words("S3", length=4, count=2)
    (tmp_path / "w.npy.json").mkdir()
    with pytest.raises(ValueError, match="w.npy.json: is a directory"):
        save_words(tmp_path / "w.npy", inputs, targets, {"group": "S3", "seed": 0})
    with pytest.raises(ValueError, match="is a directory"):
        write_generated_words(tmp_path, "S3", length=4, count=2)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TargetExistsError, match="file: not a folder"):
        write_babi_sample(tmp_path / "file")
    assert sorted(os.listdir(tmp_path)) == ["file", "w.npy.json"]


def test_failed_generation_leaves_the_old_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "g.npy"
    write_generated_words(path, "A5", length=8, count=6, seed=0)
    before = listing(tmp_path)
    monkeypatch.setattr(words, "BLOCK_TOKENS", 16)  # several blocks; the third fails
    monkeypatch.setattr(words, "_sample_tokens", fail_on_call(3, words._sample_tokens))
    with pytest.raises(Injected):
        write_generated_words(path, "A5", length=8, count=6, seed=1, targets="derived", overwrite=True)
    assert listing(tmp_path) == before


def test_generating_more_than_the_disk_holds_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bytes, but only"):
        write_generated_words(tmp_path / "huge.npy", "A5", length=10**6, count=10**9)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="too many to hold in memory"):
        generate_words("A5", length=10**9, count=10**12)


def test_failed_catbabi_build_leaves_the_old_folder(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "built"
    _build_catbabi(out)
    before = listing(tmp_path)
    babi = write_babi_sample(tmp_path_factory.mktemp("babi"))
    monkeypatch.setattr(catbabi, "_write_answers", fail_on_call(1, catbabi._write_answers))
    with pytest.raises(Injected):
        build_catbabi(babi, out, tasks=[1, 6], overwrite=True)
    assert listing(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["built"]
    monkeypatch.undo()
    build_catbabi(babi, out, tasks=[1, 6], overwrite=True)
    assert json.loads((out / "catbabi.json").read_text())["tasks"] == [1, 6]
    assert sorted(os.listdir(tmp_path)) == ["built"]
    # Built under another name, the index still records where the tokenizer ends up.
    assert TokenShards(out).tokenizer == str(out / "tokenizer")


def test_catbabi_build_replaces_only_a_built_folder(tmp_path: Path) -> None:
    babi = write_babi_sample(tmp_path / "babi")
    with pytest.raises(TargetExistsError, match=r"holds other work than a catbAbI build \(qa15_test.txt, "):
        build_catbabi(babi, babi, tasks=[1])
    (tmp_path / "file").write_text("x")
    with pytest.raises(TargetExistsError, match="file: not a folder"):
        build_catbabi(babi, tmp_path / "file", tasks=[1])
    (tmp_path / "empty").mkdir()
    build_catbabi(babi, tmp_path / "empty", tasks=[1])
    assert (tmp_path / "empty" / "catbabi.json").is_file()


def test_failed_tokenizer_save_leaves_the_old_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "tok"
    save_tokenizer(small_tokenizer(), out)
    before = listing(tmp_path)
    replacement = word_tokenizer([EOS_TOKEN, "<unk>", "x"])

    def half_written(folder: str, *args: Any, **kwargs: Any) -> None:
        (Path(folder) / "tokenizer.json").write_text("{")
        raise Injected("while saving")

    monkeypatch.setattr(replacement, "save_pretrained", half_written)
    with pytest.raises(Injected):
        tokenizer_module.save_tokenizer(replacement, out)
    assert listing(tmp_path) == before
    assert load_tokenizer(out).get_vocab() == small_tokenizer().get_vocab()


def test_failed_shard_write_leaves_no_partial_shard_and_no_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard building is resumable in place: a failure leaves whole shards, progress, no index."""
    tokenizer = small_tokenizer()
    documents = ["a b c d " * 3] * 6
    settings = {"shard_tokens": 10, "test_fraction": 0.0, "progress": False}
    real_atomic_write = shard_writer.atomic_write

    def fail_half_way(path: Path, write: Callable[[Path], None]) -> None:
        if path.name == "shard_00001.bin":
            return real_atomic_write(path, lambda temporary: (temporary.write_bytes(b"\x02\x00"), _raise()))
        return real_atomic_write(path, write)

    def _raise() -> None:
        raise Injected("disk full")

    monkeypatch.setattr(shard_writer, "atomic_write", fail_half_way)
    with pytest.raises(Injected):
        write_shards(documents, tokenizer, tmp_path, **settings)
    monkeypatch.undo()
    assert sorted(listing(tmp_path)) == ["progress.json", "train/shard_00000.bin"]
    with pytest.raises(DataError, match="no shard index"):
        TokenShards(tmp_path)
    resumed = write_shards(documents, tokenizer, tmp_path, resume=True, **settings)
    assert resumed["splits"]["train"]["tokens"] == len(TokenShards(tmp_path)) == 6 * 12 + 6
