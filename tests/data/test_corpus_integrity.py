"""The LM data pipeline holds up: one writer to a shard folder at a time, shards that name
their tokenizer and are refused by a model of another, memory that does not grow with the
input, a held-out split that holds text, and one meaning of "no text" for every form a
source can take."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from implicitlm.cli import main
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.data import corpus
from implicitlm.data.corpus import Document, read_documents
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.shards import TokenShards
from implicitlm.data.token_windows import evaluation_windows
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.tasks.lm import TokenBatches
from implicitlm.train.trainer import train

from tests.data.test_corpus import QUIET, cli, encoded, split_stream, synthetic_texts, tree_bytes
from tests.train.test_lm_train import SEQUENCE, cli_command, lm_model, subprocess_env, train_config
from tests.support.refusals import one_error_line

VOCAB = 300


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return synthetic_texts()


@pytest.fixture(scope="module")
def tokenizer(texts, tmp_path_factory):
    return train_tokenizer(texts, VOCAB, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    """A tokenizer of as many tokens, trained on other text: other merges, other ids."""
    return train_tokenizer(synthetic_texts(seed=1)[::-1], VOCAB, tmp_path_factory.mktemp("other_tokenizer"))


@pytest.fixture(scope="module")
def larger_tokenizer(texts, tmp_path_factory):
    return train_tokenizer(texts, 400, tmp_path_factory.mktemp("larger_tokenizer"))


def build(capsys, source: Path, tokenizer, out: Path, *options: str) -> tuple[int, str, str]:
    return cli(capsys, "corpus", "build", str(source), "--tokenizer", tokenizer.name_or_path, "--out", str(out),
               "--no-progress", *options)


# --- one writer at a time ----------------------------------------------------------------

# Holds a target's writer lock, as a writer in another process does, until its stdin closes.
HOLD_LOCK = """
import sys
from implicitlm.core.targets import writer_lock
with writer_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_corpus_build_into_a_folder_another_process_writes_is_refused(tokenizer, texts, tmp_path, capsys):
    """Before: two builds into one --out both exited 0 and printed "wrote"; one's shards were lost."""
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(texts))
    out = tmp_path / "shards"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=subprocess_env(),
    )
    try:
        assert holder.stdout.readline() == "held\n"
        line = one_error_line(*build(capsys, source, tokenizer, out)[::2])
        assert f"{out}: another process is writing it (process {holder.pid})" in line
        assert not out.exists()
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    code, printed, _ = build(capsys, source, tokenizer, out)
    assert code == 0 and "wrote" in printed and len(TokenShards(out)) > 0


# --- shards name their tokenizer ---------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tokenizer, tmp_path_factory) -> Path:
    """A model of the tokenizer's vocabulary with the tokenizer saved beside it, as training
    saves a checkpoint."""
    folder = tmp_path_factory.mktemp("checkpoint")
    lm_model(vocab=VOCAB).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def shards_of(tokenizer, texts: list[str], out: Path) -> Path:
    write_shards(texts, tokenizer, out, test_fraction=0.2, seed=3, **QUIET)
    return out


def lm_eval(capsys, checkpoint: Path, data: Path) -> tuple[int, str, str]:
    return cli(capsys, "lm", "eval", str(checkpoint), "--data", str(data), "--lengths", "8", "--max-tokens", "64",
               "--batch-size", "2", "--no-progress")


def as_former_index(shards: Path) -> None:
    """Rewrite the index as format 1 wrote it, before shards recorded their tokenizer's digest."""
    index = json.loads((shards / "index.json").read_text())
    del index["tokenizer_sha256"]
    (shards / "index.json").write_text(json.dumps({**index, "format_version": 1}))


def test_lm_eval_refuses_shards_of_another_tokenizer_in_one_line(
    tokenizer, other_tokenizer, larger_tokenizer, texts, checkpoint, tmp_path, capsys
):
    """Before: shards of a larger tokenizer were a 49-line IndexError, of another one of the
    same size were scored in silence."""
    ours = shards_of(tokenizer, texts, tmp_path / "ours")
    code, printed, _ = lm_eval(capsys, checkpoint, ours)
    assert code == 0 and "perplexity" in printed

    larger = shards_of(larger_tokenizer, texts, tmp_path / "larger")
    line = one_error_line(*lm_eval(capsys, checkpoint, larger)[::2])
    assert f"{larger}: the shards' tokenizer ({larger_tokenizer.name_or_path}) has 400 tokens, " \
           f"more than the model's vocab_size {VOCAB}" in line

    other = shards_of(other_tokenizer, texts, tmp_path / "other")
    assert TokenShards(other).vocab_size == VOCAB
    line = one_error_line(*lm_eval(capsys, checkpoint, other)[::2])
    assert f"{other}: tokens of the tokenizer {other_tokenizer.name_or_path} (sha256 " in line
    assert f"but {checkpoint} was trained with another" in line


def flip_a_byte(shards: Path, split: str, out: Path) -> Path:
    """A copy of ``shards`` whose first ``split`` shard has a byte flipped; returns that shard."""
    shutil.copytree(shards, out)
    shard = out / json.loads((out / "index.json").read_text())["splits"][split]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[5] ^= 0x01  # still a valid token id: only the checksum tells
    shard.write_bytes(bytes(data))
    return shard


def lm_train(shards: Path, out: Path, *options: str) -> list[str]:
    return [*cli_command(shards, out, "total_steps=1", "batch_size=2", "sequence_length=8", "batch_tokens=0"), *options]


def test_training_refuses_a_training_shard_with_a_flipped_byte(tokenizer, texts, tmp_path, capsys):
    """Before: the test shards were checked against the index's sha256 but the training shards
    were not: a flipped byte trained, exit 0."""
    ours = tmp_path / "ours"
    write_shards(texts, tokenizer, ours, test_fraction=0.2, seed=3, progress=False)  # one training shard
    shard = flip_a_byte(ours, "train", tmp_path / "damaged")
    assert main(lm_train(ours, tmp_path / "run")) == 0
    line = one_error_line(*cli(capsys, *lm_train(tmp_path / "damaged", tmp_path / "other"))[::2])
    assert f"{shard}: sha256 checksum differs from {tmp_path / 'damaged' / 'index.json'}" in line


def test_a_warm_start_refuses_shards_of_another_tokenizer(tokenizer, other_tokenizer, texts, checkpoint, tmp_path,
                                                          capsys):
    """Before: ``train --init-from CK --data SHARDS_OF_ANOTHER_TOKENIZER`` (of as many tokens)
    trained, with a warning about the batch order."""
    other = shards_of(other_tokenizer, texts, tmp_path / "other")
    line = one_error_line(*cli(capsys, *lm_train(other, tmp_path / "run", "--init-from", str(checkpoint)))[::2])
    assert f"{other}: tokens of the tokenizer {other_tokenizer.name_or_path} (sha256 " in line
    assert f"but {checkpoint} was trained with another" in line


def generate(capsys, checkpoint: Path, *options: str) -> tuple[int, str, str]:
    return cli(capsys, "generate", str(checkpoint), "--prompt", "a", "--max-new-tokens", "2", "--greedy", *options)


def test_a_tokenizer_the_model_was_not_trained_with_is_refused(
    tokenizer, other_tokenizer, larger_tokenizer, texts, checkpoint, tmp_path, capsys
):
    """Before: ``--tokenizer`` of another tokenizer, a smaller one, or a checkpoint's own
    tokenizer swapped for a smaller one generated and scored garbage, exit 0; a larger one
    failed on an embedding index."""
    smaller = train_tokenizer(texts, 280, tmp_path / "smaller")
    assert generate(capsys, checkpoint)[0] == 0
    for given in (other_tokenizer, smaller):
        line = one_error_line(*generate(capsys, checkpoint, "--tokenizer", given.name_or_path)[::2])
        assert f"{given.name_or_path}: another tokenizer (sha256 " in line
        assert f"than the one {checkpoint} was trained with" in line
    line = one_error_line(*generate(capsys, checkpoint, "--tokenizer", larger_tokenizer.name_or_path)[::2])
    assert f"{larger_tokenizer.name_or_path}: a tokenizer of 400 tokens, more than the model's vocab_size {VOCAB}" in line
    # A trained checkpoint records its shards' tokenizer: its own copy swapped is refused too.
    train(lm_model(vocab=VOCAB), train_config(total_steps=1, sequence_length=8, batch_size=2, batch_tokens=0),
          tmp_path / "run", data=shards_of(tokenizer, texts, tmp_path / "ours"), progress=False)
    trained = latest_checkpoint(tmp_path / "run")
    assert generate(capsys, trained)[0] == 0
    smaller.save_pretrained(trained)
    line = one_error_line(*generate(capsys, trained)[::2])
    assert "tokenizer" in line and str(trained) in line


def test_shards_written_before_the_digest_still_read_and_a_larger_vocabulary_is_refused(
    tokenizer, larger_tokenizer, texts, checkpoint, tmp_path, capsys
):
    """Before: a larger tokenizer's shards were an IndexError; shards of format 1 must still read."""
    ours = shards_of(tokenizer, texts, tmp_path / "ours")
    larger = shards_of(larger_tokenizer, texts, tmp_path / "larger")
    for shards in (ours, larger):
        as_former_index(shards)
        assert TokenShards(shards, "test").tokenizer_sha256 is None
    assert lm_eval(capsys, checkpoint, ours)[0] == 0
    line = one_error_line(*lm_eval(capsys, checkpoint, larger)[::2])
    assert "has 400 tokens, more than the model's vocab_size 300" in line
    # Format 2 records the digest: an index of it without one is damaged, not old.
    index = json.loads((ours / "index.json").read_text())
    (ours / "index.json").write_text(json.dumps({**index, "format_version": 2}))
    assert "expected keys ['tokenizer_sha256']" in one_error_line(*lm_eval(capsys, checkpoint, ours)[::2])


def test_a_resumed_run_refuses_shards_of_another_tokenizer(tokenizer, other_tokenizer, texts, tmp_path, capsys):
    """Before: resuming on shards of another tokenizer of the same size trained on in silence."""
    ours, other = shards_of(tokenizer, texts, tmp_path / "ours"), shards_of(other_tokenizer, texts, tmp_path / "other")
    run = tmp_path / "run"
    train(lm_model(vocab=VOCAB), train_config(total_steps=1, checkpoint_every=1), run, data=ours, progress=False)
    resume = ["train", "--out", str(run), "--resume", "--no-progress", "--train", "total_steps=2", "--data"]
    line = one_error_line(*cli(capsys, *resume, str(other))[::2])
    assert f"{other}: tokens of the tokenizer {other_tokenizer.name_or_path}" in line
    assert f"but {run / 'checkpoints' / 'step_0000001'} was trained with another" in line
    assert cli(capsys, *resume, str(ours))[0] == 0


def test_training_refuses_shards_whose_tokenizer_folder_now_holds_another(other_tokenizer, texts, tmp_path):
    """Before: the checkpoints would have carried the tokenizer now in the folder, not the
    shards' own."""
    folder = tmp_path / "tokenizer"
    tokenizer = train_tokenizer(texts, VOCAB, folder)
    shards = TokenShards(shards_of(tokenizer, texts, tmp_path / "shards"))
    TokenBatches(shards, SEQUENCE, 2)
    other_tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="written by another tokenizer than the one now in"):
        TokenBatches(shards, SEQUENCE, 2)


# --- bounded memory ----------------------------------------------------------------------

# Builds two corpora in one process: prints the peak resident memory (KiB) after the imports
# and after the builds, and each build's exit code.
MEASURE_BUILDS = """
import json, resource, sys
from implicitlm.cli import main
import implicitlm.data.shard_writer, implicitlm.data.tokenizer
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
before = peak()
tokenizer, *sources = sys.argv[1:]
codes = [main(["corpus", "build", source, "--tokenizer", tokenizer, "--out", source + ".shards", "--no-progress"])
         for source in sources]
print(json.dumps({"before": before, "after": peak(), "codes": codes}))
"""


@pytest.mark.slow
def test_corpus_build_of_megabytes_in_one_line_or_many_stays_in_bounded_memory(tokenizer, tmp_path):
    """Before: 1.7 MB took 370 MB more as one line or as 8,000 lines (10 MB: 2.2 GB; 100 MB in
    one line: 16 GB), since each document was tokenized whole."""
    words = np.random.default_rng(0).choice(["ab", "cde", "w12", "ok.", "über"], size=400_000)
    lines, one_line = tmp_path / "lines.txt", tmp_path / "one_line.txt"
    lines.write_text("".join(" ".join(words[i : i + 50]) + "\n" for i in range(0, len(words), 50)))
    one_line.write_text(" ".join(words))
    assert lines.stat().st_size > 1_500_000 and one_line.stat().st_size > 1_500_000
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE_BUILDS, tokenizer.name_or_path, str(lines), str(one_line)],
        capture_output=True, text=True, env=subprocess_env(), check=True,
    )
    result = json.loads(measured.stdout.strip().splitlines()[-1])
    # The many lines build; the one line is the last document's only line, held out whole.
    assert result["codes"] == [0, 2] and "nothing to train on" in measured.stderr
    assert (result["after"] - result["before"]) / 1024 < 150, result


def test_a_line_longer_than_the_limit_is_refused_before_it_is_held(tokenizer, tmp_path, capsys, monkeypatch):
    """Before: a line of any length was read whole, then tokenized whole."""
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 1000)
    source = tmp_path / "long.txt.gz"
    source.write_bytes(gzip.compress(b"short line\n" + b"x " * 600 + b"\nlast\n"))
    out = tmp_path / "out"
    for command in (
        ["corpus", "build", str(source), "--tokenizer", tokenizer.name_or_path, "--out", str(out), "--no-progress"],
        ["tokenizer", "train", str(source), "--vocab-size", "300", "--out", str(out)],
    ):
        line = one_error_line(*cli(capsys, *command)[::2])
        assert f"{source}:2: a line of more than 1,000 bytes, which is not read" in line
        assert not out.exists()


def long_document() -> str:
    """Over four pieces of text: prose lines, then one long line, then indented lines (whose
    leading spaces a piece must not be cut before)."""
    vocabulary = ["ab", "cde", "über", "日本", "x.", "7"]
    words = [str(word) for word in np.random.default_rng(1).choice(vocabulary, size=90_000)]
    prose = "".join(" ".join(words[i : i + 9]) + "\n" for i in range(0, 45_000, 9))
    return prose + " ".join(words[45_000:80_000]) + "\n" + "".join(f"    {word}\n\n" for word in words[80_000:])


@pytest.mark.slow
def test_a_document_of_many_pieces_is_written_token_for_token_as_whole(tokenizer, tmp_path):
    """Pieces end where the byte-level BPE's words end: the shards hold the tokens of the
    document tokenized whole, and a killed run resumed in the middle of it writes the same bytes."""
    text = long_document()
    pieces = list(corpus.text_pieces([text]))
    assert len(pieces) > 4 and "".join(pieces) == text
    whole = write_shards([text, "a last document"], tokenizer, tmp_path / "whole", **QUIET)
    assert split_stream(tmp_path / "whole", "train") == encoded(tokenizer, text)
    assert whole["splits"]["train"]["documents"] == 1

    def killed_in_the_middle(decode):  # text already: no bytes to decode
        yield from text[: 3 * len(text) // 4].splitlines(keepends=True)
        raise RuntimeError("killed")

    resumed = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="killed"):
        write_shards([Document(killed_in_the_middle, decode=None)], tokenizer, resumed, batch_documents=1, **QUIET)
    progress = json.loads((resumed / "progress.json").read_text())
    assert progress["splits"]["train"]["next_document"] == 0 and progress["splits"]["train"]["next_token"] > 0
    write_shards([text, "a last document"], tokenizer, resumed, resume=True, **QUIET)
    assert tree_bytes(resumed) == tree_bytes(tmp_path / "whole")


@pytest.mark.slow
@pytest.mark.parametrize("line_break", ["\n", "\r\n"])
def test_the_held_out_lines_of_a_long_document_are_those_of_the_documented_rule(line_break, tokenizer, tmp_path):
    """The last document is held only from where its held-out lines can begin: the split is
    the one made on the whole text, whatever its line breaks."""
    text = long_document().replace("\n", line_break)
    lines = text.splitlines(keepends=True)
    index = write_shards([text], tokenizer, tmp_path, test_fraction=0.3, **QUIET)
    needed = int(np.ceil(0.3 * len(text)))
    held_out = next(count for count in range(1, len(lines)) if sum(map(len, lines[-count:])) >= needed)
    assert index["held_out_tail"] == {"lines": held_out, "of": len(lines)}
    assert split_stream(tmp_path, "train") == encoded(tokenizer, "".join(lines[:-held_out]))
    assert split_stream(tmp_path, "test") == encoded(tokenizer, "".join(lines[-held_out:]))


# --- a held-out split of text ------------------------------------------------------------


@pytest.mark.parametrize("last_row", ["", " \n", None], ids=["empty", "blank", "no-last-row"])
def test_a_parquet_file_ending_in_an_empty_row_holds_out_lines_of_text(last_row, tokenizer, texts, tmp_path, capsys):
    """Before: an empty last row was the whole test split (1 token: eos), and training on the
    shards refused for "0 windows"."""
    words = " ".join(texts).split()
    documents = ["\n".join(" ".join(words[d * 100 + i : d * 100 + i + 5]) for i in range(0, 100, 5)) for d in range(3)]
    source = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": documents + ([] if last_row is None else [last_row])}), source)
    out = tmp_path / "shards"
    code, printed, _ = build(capsys, source, tokenizer, out, "--test-fraction", "0.05")
    assert code == 0, printed
    lines = documents[-1].splitlines(keepends=True)
    needed = np.ceil(0.05 * sum(map(len, documents)))
    held_out = next(n for n in range(1, len(lines)) if sum(map(len, lines[-n:])) >= needed)
    assert f"held out: the last {held_out} of the last document's {len(lines)} lines" in printed
    assert split_stream(out, "test") == encoded(tokenizer, "".join(lines[-held_out:]))
    assert split_stream(out, "train") == [
        token for text in [*documents[:-1], "".join(lines[:-held_out])] for token in encoded(tokenizer, text)
    ]
    assert len(list(evaluation_windows(TokenShards(out, "test"), 8, 1))) >= 2


# --- no text, in every form --------------------------------------------------------------

NO_TEXT_FILES = {
    "empty.txt": b"",
    "newlines.txt": b"\n\n\n",
    "spaces-and-tabs.txt": b"  \t \n\t\n   ",
    "crlf.txt": b"\r\n\r\n\r\n",
    "form-feeds.txt": b"\x0c\x0b\x0c\n",
    "nul-bytes.txt": b"\x00\x00\n",
    "bom.txt": "\ufeff".encode(),
    "bom-and-newlines.md": "\ufeff\r\n\n".encode(),
    "unicode-spaces.txt": "\u00a0\u2003\u3000\u2028\u2029\u0085\n".encode(),
    "zero-width.txt": "\u200b\u200c\u200d\u2060\ufeff\n".encode(),
    "blank.txt.gz": gzip.compress(b" \n \n"),
    "blank-lines.jsonl": b"\n  \n",
    "blank-texts.jsonl": json.dumps({"text": " \n\t"}).encode() + b"\n" + json.dumps({"text": "\u200b"}).encode(),
    "empty-rows.parquet": None,
    "folder": None,
}


def write_no_text(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    if name == "empty-rows.parquet":
        pq.write_table(pa.table({"text": ["", "  ", "\u3000\n"]}), path)
    elif name == "folder":
        path.mkdir()
        for file, content in NO_TEXT_FILES.items():
            if content is not None:
                (path / file).write_bytes(content)
    else:
        path.write_bytes(NO_TEXT_FILES[name])
    return path


@pytest.mark.parametrize("name", list(NO_TEXT_FILES))
def test_a_source_without_text_in_any_form_is_refused_by_both_readers(name, tokenizer, tmp_path, capsys):
    """Before: only empty files and blank JSONL were refused; whitespace, byte order marks,
    zero-width spaces and blank texts were built into shards of whitespace and eos, exit 0."""
    source = write_no_text(tmp_path, name)
    out = tmp_path / "out"
    for command in (
        ["corpus", "build", str(source), "--tokenizer", tokenizer.name_or_path, "--out", str(out), "--no-progress"],
        ["tokenizer", "train", str(source), "--vocab-size", "300", "--out", str(out)],
    ):
        assert f"error: {source}: no text in it" in one_error_line(*cli(capsys, *command)[::2])
        assert not out.exists()


def test_one_visible_character_is_text_and_documents_without_text_count_for_nothing(tokenizer, tmp_path, capsys):
    folder = write_no_text(tmp_path, "folder")
    (folder / "z.txt").write_text("\u200b \n x\u00a0\n")
    assert sorted(document.has_text for document in read_documents(folder).streamed()) == [False] * 13 + [True]
    code, printed, _ = build(capsys, folder, tokenizer, tmp_path / "out", "--test-fraction", "0")
    assert code == 0 and "held out: 0 of 1 documents" in printed
    assert split_stream(tmp_path / "out", "train") == encoded(tokenizer, "\u200b \n x\u00a0\n")
