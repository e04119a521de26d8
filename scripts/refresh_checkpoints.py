"""Bring the checkpoints the repository ships (``checkpoints/``) up to what a checkpoint
written today holds, their weights untouched: a tokenizer (a word problem's model has none)
that pads with the token their config's ``pad_token_id`` names (the eos token, as
``train_tokenizer`` sets it) and on the left, where generation needs it (``load_tokenizer``
reads every tokenizer so), a model card (``README.md``), and the digests of their config and tokenizer (``files.sha256``). Running it
again changes nothing.

    PYTHONPATH=src python scripts/refresh_checkpoints.py [CHECKPOINT ...]   (default: every shipped one)
"""

from __future__ import annotations

import sys
from pathlib import Path

from implicitlm.core.file_digests import write_files_digest
from implicitlm.core.run_folder import TRAINER_META, read_trainer_meta
from implicitlm.data.tokenizer import load_tokenizer, save_tokenizer
from implicitlm.models import load_model
from implicitlm.train.model_card import write_model_card

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"


def refresh(checkpoint: Path) -> None:
    model = load_model(checkpoint)
    if (checkpoint / "tokenizer.json").is_file():  # a word problem's model reads group elements, no text
        tokenizer = load_tokenizer(checkpoint)
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(model.config.pad_token_id)
        save_tokenizer(tokenizer, checkpoint)
    meta = read_trainer_meta(checkpoint) if (checkpoint / TRAINER_META).is_file() else {}
    write_model_card(checkpoint, model, meta)
    write_files_digest(checkpoint)


if __name__ == "__main__":
    for folder in [Path(name) for name in sys.argv[1:]] or sorted(p.parent for p in SHIPPED.rglob("config.json")):
        refresh(folder)
        print(f"refreshed {folder}")
