"""The SHA-256 of a model folder's weights, kept in a file beside them.

safetensors has no checksum, so a flipped byte in the data would load as a slightly
different model: every save of a model writes the digest (``ImplicitCausalLM.save_pretrained``)
and ``load_model`` compares it. Here, not in ``models``, so that the model class and the
loader can both use it without importing each other.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHTS = "model.safetensors"
WEIGHTS_DIGEST = "model.safetensors.sha256"


def write_weights_digest(folder: str | Path) -> None:
    """Record the SHA-256 of ``folder``'s weights beside them."""
    folder = Path(folder)
    (folder / WEIGHTS_DIGEST).write_text(weights_sha256(folder) + "\n")


def recorded_weights_digest(folder: Path) -> str | None:
    """The digest recorded beside ``folder``'s weights; None where there is none."""
    digest_file = folder / WEIGHTS_DIGEST
    if not digest_file.is_file():
        return None
    return digest_file.read_text(encoding="utf-8", errors="replace").strip()


def weights_sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    with open(folder / WEIGHTS, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
