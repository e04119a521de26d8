"""Every reader of a user file, handed what a careless or hostile user hands it.

Four probes over every reader (the file formats of test_parsers_property.py, of which
presets of every kind (word, LM, demo) share one reader; and a checkpoint's config.json,
weights and trainer.json):
- an unknown top-level key or section in a JSON file the project owns: refused in one line
  naming the file and the key (a misspelt key would be ignored, its setting left at a default);
- bytes that are not UTF-8 in a text or JSON file: refused in one line naming the file;
- an empty file: refused in one line naming the file, never read as "no data";
- a stale temporary (``.NAME.XXXX.tmp``, what a killed writer leaves) beside each file:
  read exactly as without it, and left alone (it may be another writer's work in progress).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest

from implicitlm.core.run_folder import training_settings
from implicitlm.data.corpus import read_documents
from implicitlm.models.loading import load_model
from tests.data.test_parsers_property import TARGETS, Target
from tests.train.test_words_train import WORDS_MODEL
from tests.support.models import tiny_model

# Files whose format is transformers' own (a tokenizer's): their readers take keys of
# versions this project has not seen, as transformers does.
FOREIGN_FORMATS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".csv")


def _build_checkpoint(folder: Path) -> None:
    tiny_model(**WORDS_MODEL).save_pretrained(folder / "model")
    (folder / "model" / "trainer.json").write_text(json.dumps({"train": {"batch_size": 2}}))


def _parse_checkpoint(folder: Path) -> Any:
    return {**load_model(folder / "model").state_dict(), "train": training_settings(folder / "model")}


def _read_corpus(file: str) -> Callable[[Path], Any]:
    # As the commands read a corpus or tokenizer source: one with no text is refused.
    return lambda folder: list(read_documents(folder / file, require_text=True))


CORPORA = {target.name: target for target in TARGETS if target.name.startswith("corpus-")}
READERS = [
    *(target for target in TARGETS if target.name not in CORPORA),
    *(replace(target, parse=_read_corpus(target.files[0])) for target in CORPORA.values()),
    Target(
        "checkpoint", _build_checkpoint, _parse_checkpoint,
        ("model/config.json", "model/model.safetensors", "model/trainer.json"),
    ),
]


@dataclass(frozen=True)
class Probe:
    reader: Target
    file: str

    def __str__(self) -> str:
        return f"{self.reader.name}:{self.file}"


def probes(keep: Callable[[str], bool]) -> list[Probe]:
    return [Probe(reader, file) for reader in READERS for file in reader.files if keep(file)]


def _owned_json(file: str) -> bool:
    return file.endswith(".json") and Path(file).name not in FOREIGN_FORMATS


def _text(file: str) -> bool:
    return file.endswith(TEXT_SUFFIXES)


def built(probe: Probe, tmp_path: Path) -> Path:
    probe.reader.build(tmp_path)
    return tmp_path / probe.file


def assert_refused(probe: Probe, folder: Path, path: Path, *fragments: str) -> str:
    """The reader of ``folder`` refuses it in one line naming the damaged file ``path`` (or,
    for a reader that reads a folder as one, the folder ``path`` is in) and holding each of
    ``fragments``."""
    with pytest.raises((ValueError, FileNotFoundError)) as caught:
        probe.reader.parse(folder)
    message = str(caught.value)
    assert "\n" not in message, f"{probe}: {message!r}"
    named = str(folder) in message and (path.name in message or f"{path.parent}:" in message)
    assert named, f"{probe}: the message names no file: {message!r}"
    for fragment in fragments:
        assert fragment in message, f"{probe}: {fragment!r} not in {message!r}"
    return message


@pytest.mark.parametrize("probe", probes(_owned_json), ids=str)
def test_an_unknown_top_level_key_is_refused(probe: Probe, tmp_path: Path) -> None:
    path = built(probe, tmp_path)
    content = json.loads(path.read_text())
    misspelt = f"{next(iter(content))}x" if content else "unknown"
    path.write_text(json.dumps({**content, misspelt: {}}))
    assert_refused(probe, tmp_path, path, misspelt)


@pytest.mark.parametrize("probe", probes(_text), ids=str)
def test_bytes_that_are_not_utf8_are_refused(probe: Probe, tmp_path: Path) -> None:
    path = built(probe, tmp_path)
    data = path.read_bytes()
    # Inside the first string value or line, where a decoder that replaces would hide them.
    cut = data.index(b'"', data.index(b'"') + 1) if data.startswith((b"{", b"[")) else min(len(data), 3)
    path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:])
    assert_refused(probe, tmp_path, path)


@pytest.mark.parametrize("probe", probes(lambda file: True), ids=str)
def test_an_empty_file_is_refused(probe: Probe, tmp_path: Path) -> None:
    path = built(probe, tmp_path)
    path.write_bytes(b"")
    assert_refused(probe, tmp_path, path)


@pytest.mark.parametrize("probe", probes(lambda file: True), ids=str)
def test_a_stale_temporary_beside_a_file_changes_nothing(probe: Probe, tmp_path: Path) -> None:
    path = built(probe, tmp_path)
    expected = probe.reader.parse(tmp_path)
    stale = path.parent / f".{path.name}.k1ll3d.tmp"
    stale.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    assert_same(probe.reader.parse(tmp_path), expected)
    assert stale.exists()


def assert_same(read: Any, expected: Any) -> None:
    if isinstance(expected, dict):
        assert read.keys() == expected.keys()
        for key in expected:
            assert_same(read[key], expected[key])
    elif hasattr(expected, "equal"):
        assert expected.equal(read)
    else:
        assert read == expected
