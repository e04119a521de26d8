"""The SHA-256 of the files that say how a model folder's weights are read (its config, its
generation config, its tokenizer's files), kept in ``files.sha256`` as ``sha256sum`` writes
them, so that ``sha256sum -c files.sha256`` checks them too.

The weights' own digest (``weights_digest``) leaves these unchecked, and a run folder links
its newest checkpoint's config and tokenizer: a save of another model or tokenizer into the
run folder writes through those links into the checkpoint. ``save_pretrained`` records them;
loading a model, or a tokenizer from a model folder, refuses one that changed since.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import DataError, quoted
from .weights_digest import WEIGHTS, file_sha256, write_weights_digest

FILES_DIGEST = "files.sha256"
# What transformers writes beside the weights: the config, then a tokenizer's files (fast
# and slow), which a folder holds when the model was saved with its tokenizer.
COVERED = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model",
)
LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](\S+)")


def write_files_digest(folder: str | Path) -> None:
    """Record the SHA-256 of each covered file that ``folder`` holds now."""
    folder = Path(folder)
    lines = [f"{file_sha256(folder / name)}  {name}\n" for name in COVERED if (folder / name).is_file()]
    (folder / FILES_DIGEST).write_text("".join(lines))


def check_files_digest(folder: str | Path) -> bool:
    """Whether ``folder`` records its files' digests; a recorded file that is gone or has
    changed since is a one-line DataError naming it. A covered file that is not recorded
    (a tokenizer saved after the model) is the user's own, and not checked."""
    record = Path(folder) / FILES_DIGEST
    if not record.is_file():
        return False
    text = record.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        entry = LINE.fullmatch(line.strip())
        if entry is None or entry[2] not in COVERED:
            raise DataError(f"{record}:{number}: expected a SHA-256 and the name of one of {', '.join(COVERED)}, as "
                            f"sha256sum writes them; got {quoted(line)}")
        file = record.parent / entry[2]
        if not file.is_file():
            raise DataError(f"{file}: missing, though {FILES_DIGEST} records it as part of the model")
        if file_sha256(file) != entry[1].lower():
            raise DataError(f"{file}: changed since the model was saved (its SHA-256 differs from {FILES_DIGEST}); "
                            "restore it, or save the model again to record a change of your own")
    return True


def write_model_digests(folder: str | Path) -> None:
    """After a model's save: its weights' digest (a sharded or variant save has no
    model.safetensors, which is all load_model reads) and its files'."""
    if (Path(folder) / WEIGHTS).is_file():
        write_weights_digest(folder)
    write_files_digest(folder)
