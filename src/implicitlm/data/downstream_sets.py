"""The paper's downstream sets read from local copies of their original files.

Each reader returns the evaluation split's documents in the schema of the hub dataset that
lm-evaluation-harness loads for the task, so lm-eval's own prompt and metric definitions score
them unchanged. A data folder holds the files under these names (an ``.xz``, ``.gz`` or
``.bz2`` copy of any of them is read too)::

    lambada/lambada_test.jsonl                   LAMBADA, OpenAI's test file
    hellaswag/hellaswag_val.jsonl                HellaSwag validation, original layout, or
    hellaswag/hellaswag_val_full.txt             the six-lines-per-item text layout
    piqa/valid.jsonl + piqa/valid-labels.lst     PIQA validation
    arc/ARC-Easy-Test.jsonl                      ARC-Easy test, original layout
    arc/ARC-Challenge-Test.jsonl                 ARC-Challenge test
    winogrande/dev.jsonl                         WinoGrande 1.1 dev (+ dev-labels.lst)
    openbookqa/test.jsonl                        OpenBookQA test, original layout
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .corpus import DECOMPRESSORS, jsonl_records, open_text, reading
from ..core.errors import DataError

# The six-line layout of HellaSwag: context, label, then the four endings.
HELLASWAG_LINES_PER_ITEM = 6
HELLASWAG_LABELS = {"0", "1", "2", "3"}


class MissingLocalSet(DataError):
    """A task's file is not in the data folder."""


@dataclass(frozen=True)
class LocalSet:
    """One task's evaluation documents: the split lm-eval reads them from, and the task options
    the local layout changes (e.g. documents already in processed form)."""

    split: str
    documents: list[dict[str, Any]]
    task_options: dict[str, Any] = field(default_factory=dict)


def local_file(data_dir: Path, relative: str) -> Path | None:
    """``data_dir/relative`` or a compressed copy of it, whichever exists first."""
    for suffix in ("", *DECOMPRESSORS):
        path = data_dir / f"{relative}{suffix}"
        if path.is_file():
            return path
    return None


def read_local_set(task: str, data_dir: Path) -> LocalSet:
    """The evaluation documents of lm-eval task ``task`` from ``data_dir`` (layout above)."""
    if task not in READERS:
        raise DataError(f"{task}: no local reader; tasks with one: {', '.join(READERS)}")
    return READERS[task](Path(data_dir))


def _required(data_dir: Path, relative: str, task: str) -> Path:
    path = local_file(data_dir, relative)
    if path is None:
        raise MissingLocalSet(f"{task}: {data_dir / relative} not found (nor a .xz, .gz or .bz2 copy)")
    return path


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    with reading(path):
        records = list(jsonl_records(path))
    for where, record in records:
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object")
    if not records:
        raise DataError(f"{path}: no documents")
    return records


def _field(record: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = record.get(key)
    if not isinstance(value, kind):
        raise DataError(f"{where}: expected a {kind.__name__} field {key!r}")
    return value


def _label_lines(path: Path, count: int, allowed: set[str]) -> list[str]:
    with reading(path), open_text(path) as handle:
        labels = [line.strip() for line in handle if line.strip()]
    if len(labels) != count:
        raise DataError(f"{path}: {len(labels)} labels for {count} documents")
    for line_number, label in enumerate(labels, 1):
        if label not in allowed:
            raise DataError(f"{path}:{line_number}: expected one of {sorted(allowed)}, got {label!r}")
    return labels


def _lambada(data_dir: Path) -> LocalSet:
    path = _required(data_dir, "lambada/lambada_test.jsonl", "lambada_openai")
    return LocalSet("test", [{"text": _field(record, "text", str, where)} for where, record in _records(path)])


def _piqa(data_dir: Path) -> LocalSet:
    records = _records(_required(data_dir, "piqa/valid.jsonl", "piqa"))
    labels = _label_lines(_required(data_dir, "piqa/valid-labels.lst", "piqa"), len(records), {"0", "1"})
    documents = [
        {"goal": _field(record, "goal", str, where), "sol1": _field(record, "sol1", str, where),
         "sol2": _field(record, "sol2", str, where), "label": int(label)}
        for (where, record), label in zip(records, labels)
    ]
    return LocalSet("validation", documents)


def _multiple_choice_question(record: dict[str, Any], where: str) -> tuple[str, dict[str, list[str]], str]:
    """Stem, choices (as the hub's {"text": [...], "label": [...]}) and answer key of an ARC or
    OpenBookQA record in the original layout."""
    question = _field(record, "question", dict, where)
    choices = _field(question, "choices", list, where)
    if not choices or not all(isinstance(choice, dict) for choice in choices):
        raise DataError(f"{where}: expected a non-empty list of choice objects")
    texts = [_field(choice, "text", str, where) for choice in choices]
    keys = [_field(choice, "label", str, where) for choice in choices]
    answer = _field(record, "answerKey", str, where)
    if answer.strip() not in keys:
        raise DataError(f"{where}: answer {answer!r} is not among the choice labels {keys}")
    return _field(question, "stem", str, where), {"text": texts, "label": keys}, answer


def _original_layout(relative: str, task: str, stem_key: str) -> Callable[[Path], LocalSet]:
    """The reader of an ARC or OpenBookQA test file; the hub names the stem ``stem_key``."""

    def read(data_dir: Path) -> LocalSet:
        documents = []
        for where, record in _records(_required(data_dir, relative, task)):
            stem, choices, answer = _multiple_choice_question(record, where)
            documents.append({"id": record.get("id", where), stem_key: stem, "choices": choices, "answerKey": answer})
        return LocalSet("test", documents)

    return read


def _winogrande(data_dir: Path) -> LocalSet:
    records = _records(_required(data_dir, "winogrande/dev.jsonl", "winogrande"))
    labels_path = local_file(data_dir, "winogrande/dev-labels.lst")
    labels = _label_lines(labels_path, len(records), {"1", "2"}) if labels_path else [None] * len(records)
    documents = []
    for (where, record), label in zip(records, labels):
        answer = record.get("answer", label)
        if answer not in ("1", "2") or (label is not None and answer != label):
            raise DataError(f"{where}: answer {answer!r} disagrees with dev-labels.lst ({label!r}) or is not 1 or 2")
        if "_" not in _field(record, "sentence", str, where):
            raise DataError(f"{where}: the sentence has no '_' blank")
        documents.append({"sentence": record["sentence"], "option1": _field(record, "option1", str, where),
                          "option2": _field(record, "option2", str, where), "answer": answer})
    return LocalSet("validation", documents)


def _hellaswag(data_dir: Path) -> LocalSet:
    original = local_file(data_dir, "hellaswag/hellaswag_val.jsonl")
    if original is not None:
        return LocalSet("validation", [_hellaswag_record(record, where) for where, record in _records(original)])
    path = _required(data_dir, "hellaswag/hellaswag_val_full.txt", "hellaswag")
    with reading(path), open_text(path) as handle:
        lines = handle.read().splitlines()
    if not lines or len(lines) % HELLASWAG_LINES_PER_ITEM:
        raise DataError(f"{path}: {len(lines)} lines, not a multiple of {HELLASWAG_LINES_PER_ITEM} (context, label, 4 endings)")
    documents = []
    for start in range(0, len(lines), HELLASWAG_LINES_PER_ITEM):
        context, label, *endings = lines[start:start + HELLASWAG_LINES_PER_ITEM]
        if label not in HELLASWAG_LABELS:
            raise DataError(f"{path}:{start + 2}: expected a label 0-3, got {label!r}")
        documents.append({"query": context, "choices": endings, "label": label})
    # The text layout holds the prompt lm-eval's process_docs would build from the original
    # fields, except that ctx_b's first letter is not capitalised (the split is lost).
    return LocalSet("validation", documents, {"process_docs": None})


def _hellaswag_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    endings = _field(record, "endings", list, where)
    label = record.get("label")
    if len(endings) != 4 or str(label) not in HELLASWAG_LABELS:
        raise DataError(f"{where}: expected 4 endings and a label 0-3")
    return {"activity_label": _field(record, "activity_label", str, where), "ctx_a": _field(record, "ctx_a", str, where),
            "ctx_b": _field(record, "ctx_b", str, where), "endings": endings, "label": str(label)}


READERS: dict[str, Callable[[Path], LocalSet]] = {
    "lambada_openai": _lambada,
    "hellaswag": _hellaswag,
    "piqa": _piqa,
    "arc_easy": _original_layout("arc/ARC-Easy-Test.jsonl", "arc_easy", "question"),
    "arc_challenge": _original_layout("arc/ARC-Challenge-Test.jsonl", "arc_challenge", "question"),
    "winogrande": _winogrande,
    "openbookqa": _original_layout("openbookqa/test.jsonl", "openbookqa", "question_stem"),
}
