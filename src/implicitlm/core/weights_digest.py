"""The SHA-256 of a model folder's weights, kept in a file beside them.

safetensors has no checksum, so a flipped byte in the data would load as a slightly
different model: every save of a model writes the digest (``ImplicitCausalLM.save_pretrained``)
and ``load_model`` compares it. Here, not in ``models``, so that the model class and the
loader can both use it without importing each other.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .errors import DataError, quoted

WEIGHTS = "model.safetensors"
WEIGHTS_DIGEST = "model.safetensors.sha256"
# What we write (the hex digest alone), and what ``sha256sum model.safetensors`` writes (the
# digest, then the file's name, its path as given, marked ``*`` in binary mode), in either case.
DIGEST_LINE = re.compile(rf"([0-9a-fA-F]{{64}})(?:[ \t]+\*?(?:\S*/)?{re.escape(WEIGHTS)})?")


def write_weights_digest(folder: str | Path) -> None:
    """Record the SHA-256 of ``folder``'s weights beside them."""
    folder = Path(folder)
    (folder / WEIGHTS_DIGEST).write_text(weights_sha256(folder) + "\n")


def recorded_weights_digest(folder: Path) -> str | None:
    """The digest recorded beside ``folder``'s weights, in lower case; None where there is none."""
    digest_file = folder / WEIGHTS_DIGEST
    if not digest_file.is_file():
        return None
    text = digest_file.read_text(encoding="utf-8", errors="replace").strip()
    recorded = DIGEST_LINE.fullmatch(text)
    if recorded is None:
        raise DataError(f"{digest_file}: expected a SHA-256 hex digest, alone or as sha256sum writes it "
                        f"(followed by {WEIGHTS}); got {quoted(text)}")
    return recorded[1].lower()


def weights_sha256(folder: Path) -> str:
    return file_sha256(folder / WEIGHTS)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
