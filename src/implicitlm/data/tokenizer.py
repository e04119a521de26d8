"""Byte-level BPE tokenizers: trained here and saved as Hugging Face fast tokenizers, or loaded.

Every tokenizer used for the token shards needs an end-of-sequence token: it separates the
documents there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from implicitlm.atomic_io import atomic_write
from implicitlm.data.corpus import first_line
from implicitlm.data.errors import DataError

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(
    documents: Iterable[str], vocab_size: int, out_dir: str | os.PathLike
) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE of ``vocab_size`` tokens (eos included) on ``documents``.

    Saves it to ``out_dir`` (loadable with ``load_tokenizer`` or ``AutoTokenizer``) and
    returns it as loaded from there. Any text round-trips: ``decode(encode(text)) == text``.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(
            f"vocab_size must be at least {len(alphabet) + 1} (every byte and the eos token), "
            f"got {vocab_size}"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # The full byte alphabet, seen in the corpus or not, so that no text is out of vocabulary.
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(documents, trainer)
    # Cleaning up spaces around punctuation on decoding would break the round trip.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, clean_up_tokenization_spaces=False
    )
    save_tokenizer(tokenizer, Path(out_dir))
    return load_tokenizer(out_dir)


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """A tokenizer from a local directory or the Hugging Face hub; it must have an eos token."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.fspath(name_or_path))
    # Loading fails in many ways (no such directory or repository, network, a malformed
    # file), with exception types that differ between library versions.
    except Exception as error:
        raise DataError(f"{name_or_path}: cannot load a tokenizer: {first_line(error)}") from error
    if tokenizer.eos_token_id is None:
        raise DataError(
            f"{name_or_path}: the tokenizer has no eos token, which the shards need "
            f"to separate documents"
        )
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """``save_pretrained`` into ``out_dir``, each file written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained writes in place; staging its files makes each appear whole or not at all.
    with tempfile.TemporaryDirectory(dir=out_dir) as staging:
        tokenizer.save_pretrained(staging)
        for staged in sorted(Path(staging).iterdir()):
            atomic_write(
                out_dir / staged.name,
                lambda temporary, staged=staged: shutil.copyfile(staged, temporary),
            )
