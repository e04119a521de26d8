"""The language-model corpus pipeline: documents, tokenizer, token shards and samplers."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from implicitlm.cli import main
from implicitlm.data.corpus import read_documents
from implicitlm.core.errors import DataError
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.shards import TokenShards, token_dtype
from implicitlm.data.token_windows import TokenSampler, evaluation_windows
from implicitlm.data.tokenizer import EOS_TOKEN, load_tokenizer, train_tokenizer
from tests.support.refusals import one_error_line

SHARD_TOKENS = 1000
QUIET = {"progress": False, "shard_tokens": SHARD_TOKENS}


def synthetic_texts(count: int = 40, seed: int = 0) -> list[str]:
    """Random prose over a small vocabulary, with one document longer than three shards."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" + "aeiou"[i % 5] * (i % 3) for i in range(150)] + ["über", "日本", "ok."]
    lengths = rng.integers(5, 200, size=count)
    lengths[count // 3] = 3000
    return [
        " ".join(rng.choice(words, size=length)) + rng.choice(["", "\n", "\n\n  "])
        for length in lengths
    ]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return synthetic_texts()


@pytest.fixture(scope="module")
def tokenizer(texts, tmp_path_factory):
    return train_tokenizer(texts, 400, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def written(texts, tokenizer, tmp_path_factory) -> Path:
    """Shards of ``texts`` with test_fraction 0.2 (a fixed seed), shared by the reader tests."""
    out = tmp_path_factory.mktemp("shards")
    write_shards(texts, tokenizer, out, test_fraction=0.2, seed=3, **QUIET)
    return out


def data_error(function: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """The message of the DataError that ``function`` raises; it must be one line."""
    with pytest.raises(DataError) as caught:
        function(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def reference_test_split(count: int, fraction: float, seed: int) -> list[bool]:
    """The documented split rule, from its definition."""
    chosen = [
        int.from_bytes(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest(), "little")
        < fraction * 2**64
        for i in range(count)
    ]
    if fraction > 0 and not any(chosen):
        chosen[-1] = True
    return chosen


def reference_stream(texts: list[str], tokenizer, in_split: list[bool]) -> np.ndarray:
    eos = tokenizer.eos_token_id
    tokens = [
        [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]
        for text, chosen in zip(texts, in_split)
        if chosen
    ]
    return np.array([token for document in tokens for token in document], dtype=np.int64)


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def killed_after(texts: list[str], count: int) -> Iterator[str]:
    yield from texts[:count]
    raise RuntimeError("killed")


# --- documents ---------------------------------------------------------------------------


def test_reads_text_jsonl_parquet_and_directories_in_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.txt").write_text("first file\n")
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "j1", "id": 1}\n\n{"text": "j2"}\n')
    rows = [f"row {i}" for i in range(2500)]  # more than one record batch
    pq.write_table(pa.table({"text": rows, "n": list(range(2500))}), tmp_path / "c.parquet")
    (tmp_path / "d.py").write_bytes(b"print('x')\n# \xff invalid utf-8\n")
    (tmp_path / ".git" / "config").write_text("not a document")

    documents = read_documents(tmp_path, errors="replace")

    expected = ["first file\n", *rows, "print('x')\n# \ufffd invalid utf-8\n", "j1", "j2"]
    assert list(documents) == expected
    assert (documents.replaced_bytes, documents.replaced_lines) == (1, 1)
    message = data_error(list, read_documents(tmp_path))
    assert message.startswith(f"{tmp_path / 'd.py'}:2: got byte 0xff at offset 2, which is not UTF-8")
    assert list(read_documents(tmp_path, pattern="*.jsonl")) == ["j1", "j2"]
    assert list(read_documents([tmp_path / "sub" / "b.jsonl", tmp_path / "a.txt"])) == [
        "j1",
        "j2",
        "first file\n",
    ]
    (tmp_path / "e.jsonl").write_text('{"body": "other field"}\n')
    assert list(read_documents(tmp_path / "e.jsonl", text_field="body")) == ["other field"]


@pytest.mark.parametrize("compression", ["xz", "gz", "bz2"])
def test_compressed_files_read_as_their_inner_kind(compression, tmp_path):
    import bz2
    import gzip
    import lzma

    opener = {"xz": lzma.open, "gz": gzip.open, "bz2": bz2.open}[compression]
    text = " = Title = \r\n body \xff line\n".encode("latin-1")
    with opener(tmp_path / f"a.txt.{compression}", "wb") as handle:
        handle.write(text)
    with opener(tmp_path / f"b.jsonl.{compression}", "wb") as handle:
        handle.write(b'{"text": "j1"}\n\n{"text": "j2"}\n')

    # The same documents as the uncompressed files give, line endings and U+FFFD included.
    assert list(read_documents(tmp_path, errors="replace")) == [" = Title = \r\n body \ufffd line\n", "j1", "j2"]
    assert f"a.txt.{compression}:2: got byte 0xff" in data_error(list, read_documents(tmp_path))

    damaged = tmp_path / f"c.txt.{compression}"
    damaged.write_bytes((tmp_path / f"a.txt.{compression}").read_bytes()[:-6])
    assert f"{damaged}: cannot read" in data_error(list, read_documents(damaged, errors="replace"))
    missing = tmp_path / f"missing.txt.{compression}"
    assert f"{missing}: no such file" in data_error(read_documents, missing)
    packed = tmp_path / f"d.parquet.{compression}"
    packed.write_bytes(b"")
    assert "compressed Parquet is not read" in data_error(list, read_documents(packed))


def test_document_errors_name_the_file_and_line(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "ok"}\n\n{"text": broken}\n')
    assert f"{bad_json}:3: expected a JSON object" in data_error(list, read_documents(bad_json))

    no_field = tmp_path / "field.jsonl"
    no_field.write_text('{"text": "ok"}\n{"content": "x"}\n')
    assert f"{no_field}:2:" in data_error(list, read_documents(no_field))
    assert "'text'" in data_error(list, read_documents(no_field))

    missing = tmp_path / "missing.jsonl"
    assert f"{missing}: no such file" in data_error(read_documents, [bad_json, missing])

    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("plain text")
    assert f"{not_parquet}: cannot read as Parquet" in data_error(list, read_documents(not_parquet))

    columns = tmp_path / "columns.parquet"
    pq.write_table(pa.table({"body": ["x"]}), columns)
    assert "expected a column 'text'" in data_error(list, read_documents(columns))

    assert "no files match '*.md'" in data_error(read_documents, tmp_path, pattern="*.md")

    not_utf8 = tmp_path / "bytes.jsonl"
    not_utf8.write_bytes(b'{"text": "ok"}\n\n{"text": "\xe2\x82 cut"}\n')
    assert f"{not_utf8}:3: got byte 0xe2 at offset 10" in data_error(list, read_documents(not_utf8))
    replaced = read_documents(not_utf8, errors="replace")
    assert list(replaced) == ["ok", "\ufffd cut"]
    assert (replaced.replaced_bytes, replaced.replaced_lines) == (2, 1)
    assert "errors must be one of strict, replace" in str(pytest.raises(ValueError, read_documents, not_utf8, errors="ignore").value)


def test_hub_failure_becomes_one_data_error(monkeypatch):
    def unreachable(name, split, streaming):
        assert (split, streaming) == ("validation", True)
        raise ConnectionError("the hub is unreachable\nretry details")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    message = data_error(list, read_documents("someone/corpus", split="validation"))
    assert message.startswith("someone/corpus: not a local path")
    assert "ConnectionError: the hub is unreachable" in message


# --- tokenizer ---------------------------------------------------------------------------


def test_trained_tokenizer_round_trips_through_auto_tokenizer(tokenizer):
    reloaded = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    assert reloaded.eos_token == EOS_TOKEN and reloaded.eos_token_id is not None
    assert len(reloaded) == len(tokenizer) == 400
    for text in ["w1a w2ee über 日本 ok.", "  leading\tand\r\ntrailing  ", "unseen 🙂 ¿x? \x00"]:
        ids = reloaded(text, add_special_tokens=False)["input_ids"]
        assert reloaded.decode(ids) == text
        assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_load_tokenizer_failure_is_one_data_error(tmp_path):
    assert str(tmp_path) in data_error(load_tokenizer, tmp_path)


# --- shard writer and reader ---------------------------------------------------------------


def test_shards_hold_the_documents_of_each_split_token_for_token(texts, tokenizer, written):
    in_test = reference_test_split(len(texts), 0.2, seed=3)
    assert 0 < sum(in_test) < len(texts)
    index = json.loads((written / "index.json").read_text())
    assert (index["dtype"], index["eos_token_id"]) == ("uint16", tokenizer.eos_token_id)
    assert index["documents"] == len(texts)
    for split, chosen in (("train", [not c for c in in_test]), ("test", in_test)):
        shards = TokenShards(written, split, verify=True)
        expected = reference_stream(texts, tokenizer, chosen)
        assert len(shards) == index["splits"][split]["tokens"] == len(expected)
        assert np.array_equal(shards.read(0, len(shards)), expected)
        assert index["splits"][split]["documents"] == sum(chosen)
        records = index["splits"][split]["shards"]
        assert [record["tokens"] for record in records[:-1]] == [SHARD_TOKENS] * (len(records) - 1)
        for record in records:
            assert (written / record["file"]).stat().st_size == 2 * record["tokens"]
    train = TokenShards(written)
    assert len(index["splits"]["train"]["shards"]) > 4
    assert (train.vocab_size, train.eos_token_id, train.dtype) == (400, 0, np.dtype("<u2"))
    whole = train.read(0, len(train))
    for start, length in [(990, 20), (0, 2 * SHARD_TOKENS + 1), (len(train) - 7, 7), (5, 0)]:
        assert np.array_equal(train.read(start, length), whole[start : start + length])
    with pytest.raises(IndexError):
        train.read(len(train) - 3, 4)


class LargeVocabularyTokenizer:
    """One token per character (below U+1000), numbered from 2**16 up: shards need uint32."""

    name_or_path = "characters"
    eos_token_id = 0

    def __len__(self) -> int:
        return 2**16 + 2**12

    def __call__(self, texts: list[str], **_: Any) -> dict[str, list[list[int]]]:
        return {"input_ids": [[2**16 + ord(c) for c in text] for text in texts]}


def test_shard_dtype_is_uint16_while_the_vocabulary_fits_else_uint32(tmp_path):
    assert token_dtype(2**16) == np.dtype("<u2")
    assert token_dtype(2**16 + 1) == np.dtype("<u4")
    texts = ["abc", "de", "f"]
    index = write_shards(texts, LargeVocabularyTokenizer(), tmp_path, test_fraction=0, **QUIET)
    shards = TokenShards(tmp_path)
    assert index["dtype"] == "uint32" and shards.dtype == np.dtype("<u4")
    expected = [token for text in texts for token in [*(2**16 + ord(c) for c in text), 0]]
    assert shards.read(0, len(shards)).tolist() == expected
    assert (tmp_path / "train" / "shard_00000.bin").stat().st_size == 4 * len(expected)
    assert len(TokenShards(tmp_path, "test")) == 0


def test_two_workers_write_the_same_bytes_as_one(texts, tokenizer, written, tmp_path):
    settings = {"test_fraction": 0.2, "seed": 3, **QUIET}
    write_shards(texts, tokenizer, tmp_path, workers=2, batch_documents=3, **settings)
    assert tree_bytes(tmp_path) == tree_bytes(written)


def test_split_depends_only_on_seed_and_small_corpora_get_a_test_document(
    texts, tokenizer, written, tmp_path
):
    again, other = tmp_path / "again", tmp_path / "other"
    write_shards(texts, tokenizer, again, test_fraction=0.2, seed=3, **QUIET)
    write_shards(texts, tokenizer, other, test_fraction=0.2, seed=4, **QUIET)
    assert tree_bytes(again) == tree_bytes(written)
    assert reference_test_split(len(texts), 0.2, 3) != reference_test_split(len(texts), 0.2, 4)
    test_stream = TokenShards(other, "test").read(0, len(TokenShards(other, "test")))
    expected = reference_stream(texts, tokenizer, reference_test_split(len(texts), 0.2, 4))
    assert np.array_equal(test_stream, expected)

    small = write_shards(texts[:3], tokenizer, tmp_path / "small", test_fraction=0.001, **QUIET)
    assert (small["splits"]["train"]["documents"], small["splits"]["test"]["documents"]) == (2, 1)
    assert "no documents" in data_error(write_shards, [], tokenizer, tmp_path / "empty", **QUIET)


def test_given_test_documents_are_the_test_split_and_every_source_is_trained_on(
    texts, tokenizer, tmp_path
):
    train_texts, held_out = texts[:30], texts[30:]
    index = write_shards(train_texts, tokenizer, tmp_path / "given", test_documents=held_out, **QUIET)
    assert index["test_fraction"] is None
    assert (index["splits"]["train"]["documents"], index["splits"]["test"]["documents"]) == (30, 10)
    for split, chosen in (("train", [True] * 30 + [False] * 10), ("test", [False] * 30 + [True] * 10)):
        shards = TokenShards(tmp_path / "given", split, verify=True)
        assert np.array_equal(shards.read(0, len(shards)), reference_stream(texts, tokenizer, chosen))

    # A killed build resumes to the same bytes; one that switches to a test fraction is refused.
    with pytest.raises(RuntimeError, match="killed"):
        write_shards(killed_after(train_texts, 20), tokenizer, tmp_path / "resumed",
                     test_documents=held_out, batch_documents=1, **QUIET)
    write_shards(train_texts, tokenizer, tmp_path / "resumed", test_documents=held_out, resume=True, **QUIET)
    assert tree_bytes(tmp_path / "resumed") == tree_bytes(tmp_path / "given")
    switched = data_error(write_shards, texts, tokenizer, tmp_path / "given", resume=True, **QUIET)
    assert "other settings (test_fraction)" in switched


def test_a_test_source_that_the_training_sources_read_is_refused(tokenizer, tmp_path, capsys):
    """Before: ``corpus build A --test-sources A`` held out the training text itself, exit 0."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("some training text\nand more\n")
    (corpus / "valid.md").write_text("held-out text\n")
    (tmp_path / "link.txt").symlink_to(corpus / "train.txt")
    out = tmp_path / "out"

    def build(sources: list[Path], test_sources: list[Path], *options: str) -> tuple[int, str, str]:
        return cli(capsys, "corpus", "build", *map(str, sources), "--test-sources", *map(str, test_sources),
                   "--tokenizer", tokenizer.name_or_path, "--out", str(out), "--no-progress", *options)

    for sources, test_sources, source, reads in (
        ([corpus / "train.txt"], [corpus / "train.txt"], corpus / "train.txt", corpus / "train.txt"),  # is
        ([corpus / "train.txt"], [corpus], corpus, corpus / "train.txt"),  # holds
        ([corpus], [corpus / "valid.md"], corpus / "valid.md", corpus / "valid.md"),  # lies in
        ([corpus / "train.txt"], [tmp_path / "link.txt"], tmp_path / "link.txt", corpus / "train.txt"),  # a link to
    ):
        line = one_error_line(*build(sources, test_sources)[::2])
        assert line == (f"implicitlm: error: {source}: in --test-sources, but the training source {sources[0]} reads "
                        f"{reads.resolve()} too: its text would be trained on and scored as held out")
        assert not out.exists()
    # A file in a training folder that its pattern does not read is held-out text.
    code, printed, _ = build([corpus], [corpus / "valid.md"], "--pattern", "*.txt")
    assert code == 0 and "held out: " in printed


def test_a_test_source_holding_a_copy_of_a_training_file_is_refused(tokenizer, tmp_path, capsys):
    """Before: a copy of the training text (another path, the same bytes) was held out, exit 0."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.txt").write_text("some training text\nand more\n")
    (tmp_path / "corpus" / "other.txt").write_text("some training text\nand less\n")  # of the same size
    (tmp_path / "held").mkdir()
    shutil.copy(tmp_path / "corpus" / "train.txt", tmp_path / "held" / "copy.txt")
    (tmp_path / "held" / "valid.txt").write_text("held-out text\n")

    def build(*test_sources: Path) -> tuple[int, str, str]:
        return cli(capsys, "corpus", "build", str(tmp_path / "corpus"), "--test-sources", *map(str, test_sources),
                   "--tokenizer", tokenizer.name_or_path, "--out", str(tmp_path / "out"), "--no-progress")

    line = one_error_line(*build(tmp_path / "held")[::2])
    assert line == (f"implicitlm: error: {tmp_path / 'held'}: in --test-sources, but {(tmp_path / 'held' / 'copy.txt').resolve()} "
                    f"holds the same bytes as {(tmp_path / 'corpus' / 'train.txt').resolve()}, which the training source "
                    f"{tmp_path / 'corpus'} reads: its text would be trained on and scored as held out")
    assert not (tmp_path / "out").exists()
    code, printed, _ = build(tmp_path / "held" / "valid.txt")
    assert code == 0 and "held out: " in printed


# One document at a time, a document is written once the next one is read, and the first
# shard closes with document 2: killed after 2, no progress is recorded yet; after 15, the run
# stops inside a test document that spans eight shards.
@pytest.mark.parametrize(
    "kill_after, workers", [(2, 1), (4, 1), (9, 1), (15, 1), (23, 2), (39, 1)]
)
def test_resumed_run_writes_the_same_bytes_as_an_uninterrupted_one(
    kill_after, workers, texts, tokenizer, written, tmp_path
):
    settings = {"test_fraction": 0.2, "seed": 3, **QUIET}
    killed = killed_after(texts, kill_after)
    with pytest.raises(RuntimeError, match="killed"):
        write_shards(killed, tokenizer, tmp_path, workers=workers, batch_documents=1, **settings)
    assert (tmp_path / "progress.json").exists() == (kill_after > 2)

    write_shards(texts, tokenizer, tmp_path, resume=True, **settings)

    assert tree_bytes(tmp_path) == tree_bytes(written)


def test_existing_output_is_only_replaced_when_asked(texts, tokenizer, tmp_path):
    with pytest.raises(RuntimeError, match="killed"):
        write_shards(killed_after(texts, 9), tokenizer, tmp_path, batch_documents=1, **QUIET)
    assert "unfinished run; continue it with resume=True" in data_error(
        write_shards, texts, tokenizer, tmp_path, **QUIET
    )
    write_shards(texts, tokenizer, tmp_path, overwrite=True, **QUIET)
    assert "replace them with overwrite=True" in data_error(write_shards, texts, tokenizer, tmp_path, **QUIET)
    assert write_shards(texts, tokenizer, tmp_path, resume=True, **QUIET)["documents"] == 40
    other = {**QUIET, "shard_tokens": 2 * SHARD_TOKENS}
    changed = data_error(write_shards, texts, tokenizer, tmp_path, resume=True, **other)
    assert "other settings (shard_tokens)" in changed

    write_shards(texts[:2], tokenizer, tmp_path, overwrite=True, progress=False)
    assert sorted(path.name for path in tmp_path.rglob("shard_*.bin")) == ["shard_00000.bin"] * 2


def test_damaged_shard_directories_give_one_line_errors(written, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(written, damaged)
    shard = damaged / "train" / "shard_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    assert f"{shard}: expected 2000 bytes" in data_error(TokenShards, damaged)
    assert "truncated" in data_error(TokenShards, damaged)

    original = (written / "train" / "shard_00001.bin").read_bytes()
    shard.write_bytes(original[:10] + bytes([original[10] ^ 1]) + original[11:])
    assert len(TokenShards(damaged)) == len(TokenShards(written))
    assert f"{shard}: sha256 checksum differs" in data_error(TokenShards, damaged, verify=True)

    shard.unlink()
    assert f"{shard}: missing" in data_error(TokenShards, damaged)

    index = damaged / "index.json"
    index.write_text('{"format_version": 1,\n "dtype": }')
    assert f"{index}:2: expected JSON" in data_error(TokenShards, damaged)
    index.write_text('{"format_version": 1}')
    assert "expected keys ['dtype'" in data_error(TokenShards, damaged)
    index.unlink()
    assert f"{index}: no shard index" in data_error(TokenShards, damaged)
    assert "no split 'valid'" in data_error(TokenShards, written, "valid")


# --- samplers ----------------------------------------------------------------------------


def window_ids(shards: TokenShards, window: int, batches: list) -> list[int]:
    """Which window of the split each row of ``batches`` is; every window must be unique."""
    count = len(shards) // window
    windows = shards.read(0, count * window).reshape(count, window).astype(np.int64)
    assert len(np.unique(windows, axis=0)) == count
    ids = []
    for batch in batches:
        for row in batch.numpy():
            (matches,) = np.nonzero((windows == row).all(axis=1))
            ids.extend(matches.tolist())
    return ids


def test_sampler_visits_each_window_once_per_epoch_in_a_seeded_order(written):
    shards = TokenShards(written)
    sampler = TokenSampler(shards, sequence_length=63, batch_size=5, seed=1)
    per_epoch = sampler.windows // 5
    epochs = [[next(sampler) for _ in range(per_epoch)] for _ in range(2)]
    assert epochs[0][0].shape == (5, 64) and epochs[0][0].dtype == torch.int64
    first, second = (window_ids(shards, 64, batches) for batches in epochs)
    assert len(set(first)) == len(first) == per_epoch * 5
    assert first != second and sampler.epoch == 1

    same = TokenSampler(shards, sequence_length=63, batch_size=5, seed=1)
    other = TokenSampler(shards, sequence_length=63, batch_size=5, seed=2)
    assert all(next(same).equal(batch) for batch in epochs[0])
    assert not next(other).equal(epochs[0][0])


def test_sampler_state_restores_the_same_batches(written):
    shards = TokenShards(written)
    sampler = TokenSampler(shards, sequence_length=127, batch_size=8, seed=5)
    for _ in range(3):
        next(sampler)
    state = json.loads(json.dumps(sampler.state_dict()))
    expected = [next(sampler) for _ in range(sampler.windows // 8 + 2)]  # past an epoch end

    restored = TokenSampler(shards, sequence_length=127, batch_size=8, seed=5)
    restored.load_state_dict(state)
    assert all(next(restored).equal(batch) for batch in expected)
    with pytest.raises(ValueError, match="seed"):
        TokenSampler(shards, sequence_length=127, batch_size=8, seed=6).load_state_dict(state)


def test_ranks_split_each_global_batch_between_them(written):
    shards = TokenShards(written)
    single = TokenSampler(shards, sequence_length=31, batch_size=6, seed=7)
    ranks = [TokenSampler(shards, 31, batch_size=3, seed=7, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(single.windows // 6 + 3):
        assert next(single).equal(torch.cat([next(rank) for rank in ranks]))
    with pytest.raises(DataError, match="fewer than the"):
        TokenSampler(shards, sequence_length=len(shards), batch_size=1)


def test_evaluation_windows_cover_the_test_split_in_order(written):
    shards = TokenShards(written, "test")
    batches = list(evaluation_windows(shards, sequence_length=15, batch_size=7))
    count = len(shards) // 16
    assert [len(batch) for batch in batches[:-1]] == [7] * (len(batches) - 1)
    assert 0 < len(batches[-1]) <= 7 and sum(map(len, batches)) == count
    joined = np.concatenate([batch.numpy() for batch in batches]).reshape(-1)
    assert np.array_equal(joined, shards.read(0, count * 16))


# --- the command line ----------------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def split_stream(shards: Path, split: str) -> list[int]:
    tokens = TokenShards(shards, split)
    return tokens.read(0, len(tokens)).tolist()


def encoded(tokenizer, text: str) -> list[int]:
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def test_bytes_that_are_not_utf8_are_one_line_naming_file_and_line_unless_replace_is_asked(
    tokenizer, tmp_path, capsys
):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"fine\nabc\xff\xfedef\n")
    tok, shards = tmp_path / "tok", tmp_path / "s"
    train_tok = ["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tok)]
    build = ["corpus", "build", str(corpus), "--out", str(shards), "--no-progress", "--workers", "2"]
    for command in (train_tok, [*build, "--tokenizer", tokenizer.name_or_path]):
        message = one_error_line(*cli(capsys, *command)[::2])
        assert f"{corpus}:2: got byte 0xff at offset 3, which is not UTF-8" in message
        assert "--errors replace" in message
    assert not tok.exists() and not shards.exists()

    code, out, _ = cli(capsys, *train_tok, "--errors", "replace")
    assert code == 0 and out.strip().endswith(f"to {tok} (replaced 2 undecodable bytes in 1 line)")
    code, out, _ = cli(capsys, *build, "--tokenizer", str(tok), "--errors", "replace")
    assert code == 0 and out.strip().endswith("; replaced 2 undecodable bytes in 1 line)")
    replaced = load_tokenizer(tok)
    assert split_stream(shards, "test") == encoded(replaced, "abc\ufffd\ufffddef\n")


def test_more_workers_than_the_memory_holds_are_refused_before_any_starts(tokenizer, tmp_path, capsys):
    import multiprocessing

    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n" * 10)
    code, out, err = cli(capsys, "corpus", "build", str(corpus), "--tokenizer", tokenizer.name_or_path, "--out",
                         str(tmp_path / "s"), "--no-progress", "--workers", "100000")
    message = one_error_line(code, err)
    assert "tokenizing in 100,000 processes needs at least " in message and "is available" in message
    assert "--workers" in message and not (tmp_path / "s").exists() and not multiprocessing.active_children()


def test_a_source_without_text_is_refused_where_it_is_read(tokenizer, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("some text\nand more\n")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_text('\n{"text": ""}\n\n')
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"")
    for source in map(str, (empty, blank, folder)):
        out = tmp_path / "out"
        commands = [
            ["tokenizer", "train", source, "--vocab-size", "300", "--out", str(out)],
            ["corpus", "build", source, "--tokenizer", tokenizer.name_or_path, "--out", str(out), "--no-progress"],
            ["corpus", "build", str(text), "--test-sources", source, "--tokenizer", tokenizer.name_or_path,
             "--out", str(out), "--no-progress"],
        ]
        for command in commands:
            assert f"error: {source}: no text in it" in one_error_line(*cli(capsys, *command)[::2])
            assert not out.exists()
    # A source with text beside an empty file of it is read.
    (folder / "b.txt").write_text("text")
    assert list(read_documents(folder, require_text=True)) == ["", "text"]


def held_out_line_count(lines: list[str], fraction: float) -> int:
    """The documented rule: the fewest last lines that hold ``fraction`` of the characters."""
    needed = math.ceil(fraction * sum(map(len, lines)))
    count = 1
    while sum(map(len, lines[-count:])) < needed:
        count += 1
    return count


def test_a_one_file_corpus_trains_on_all_but_its_last_lines(tokenizer, texts, tmp_path, capsys):
    words = " ".join(texts).split() * 4
    lines = [f"{' '.join(words[i * 7 : i * 7 + 7])}\n" for i in range(3000)]
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(lines))
    shards = tmp_path / "s"
    code, out, _ = cli(capsys, "corpus", "build", str(corpus), "--tokenizer", tokenizer.name_or_path,
                       "--out", str(shards), "--no-progress")
    assert code == 0
    held_out = held_out_line_count(lines, 0.001)
    assert f"(held out: the last {held_out} of the last document's 3,000 lines)" in out
    assert split_stream(shards, "train") == encoded(tokenizer, "".join(lines[:-held_out]))
    assert split_stream(shards, "test") == encoded(tokenizer, "".join(lines[-held_out:]))
    index = json.loads((shards / "index.json").read_text())
    assert index["held_out_tail"] == {"lines": held_out, "of": 3000}
    assert held_out < 10 and 0 < len(TokenShards(shards, "test")) < 0.01 * len(TokenShards(shards, "train"))

    # Any corpus that draws no test document splits its last one so, however many it has; the
    # first line always trains, and a last document of one line is held out whole.
    index = write_shards(["one line", "a\nb\n"], tokenizer, tmp_path / "two", test_fraction=0.4, seed=1, **QUIET)
    assert index["held_out_tail"] == {"lines": 1, "of": 2}
    assert split_stream(tmp_path / "two", "train") == [*encoded(tokenizer, "one line"), *encoded(tokenizer, "a\n")]
    index = write_shards(["a\nb", "one line"], tokenizer, tmp_path / "whole", test_fraction=0.001, **QUIET)
    assert index["held_out_tail"] is None
    assert split_stream(tmp_path / "whole", "test") == encoded(tokenizer, "one line")
    # A corpus of one line has nothing left to train on: refused, not written with no training tokens.
    one_line = tmp_path / "line.txt"
    one_line.write_text("just one line of text\n")
    code, _, err = cli(capsys, "corpus", "build", str(one_line), "--tokenizer", tokenizer.name_or_path,
                       "--out", str(tmp_path / "line"), "--no-progress")
    assert code == 2 and "nothing to train on" in err and err.count("\n") == 1
    assert not (tmp_path / "line").exists()


# A command under a limit of open files below the shards' count, in a fresh interpreter.
UNDER_FILE_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from implicitlm.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_more_shards_than_a_process_may_open_files_are_written_read_and_trained_on(shards, tmp_path):
    import subprocess
    import sys

    def under_limit(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", UNDER_FILE_LIMIT, *argv], capture_output=True, text=True,
                              cwd=tmp_path, timeout=600)

    source = Path(__file__).parents[2] / "src" / "implicitlm" / "train"
    built = under_limit("corpus", "build", str(source), "--pattern", "*.py", "--tokenizer", str(shards.parent / "tokenizer"),
                        "--out", "many", "--shard-tokens", "128", "--test-fraction", "0.1", "--no-progress")
    assert built.returncode == 0, built.stderr[-2000:]
    assert len(list((tmp_path / "many" / "train").glob("shard_*.bin"))) > 256
    trained = under_limit("train", "--data", "many", "--config", "lm_demo", "--out", "run", "--no-progress",
                          "--model", "hidden_size=16", "--model", "head_dim=8", "--model", "num_hidden_layers=1",
                          "--train", "total_steps=2", "--train", "sequence_length=32", "--train", "batch_size=2",
                          "--train", "batch_tokens=64", "--train", "eval_every=1")
    assert trained.returncode == 0, trained.stderr[-2000:]
