"""Byte-level BPE tokenizers: trained here and saved as Hugging Face fast tokenizers, or loaded.

Every tokenizer used for the token shards needs an end-of-sequence token: it separates the
documents there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

from huggingface_hub.constants import ENDPOINT as HF_ENDPOINT
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from implicitlm.core.atomic_io import atomic_write
from implicitlm.core.errors import DataError, OptionError, first_line
from implicitlm.core.hub import check_local_or_hub, hub_unreachable
from implicitlm.core.log_lines import without_log_lines
from implicitlm.core.file_digests import check_files_digest
from implicitlm.core.memory import require
from implicitlm.core.run_folder import model_folder
from implicitlm.core.targets import exclusive_target

EOS_TOKEN = "<|endoftext|>"
# Where a batch's padding goes: before each text, so that every row ends at its last real
# token, where generation continues it; a right-padded prompt would be continued from its pads.
PADDING_SIDE = "left"
MAX_VOCAB_SIZE = 2**32 - 1
BYTES_PER_TOKEN_AT_LEAST = 64


def train_tokenizer(
    documents: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, overwrite: bool = False
) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE of ``vocab_size`` tokens (eos included) on ``documents``.

    Saves it to ``out_dir`` (loadable with ``load_tokenizer`` or ``AutoTokenizer``) and
    returns it as loaded from there. Any text round-trips: ``decode(encode(text)) == text``.
    An ``out_dir`` that holds anything (a tokenizer, a checkpoint) is refused, before the
    training, unless ``overwrite``: then the tokenizer's files replace theirs, and other files stay.
    """
    _check_vocab_size(vocab_size)
    _check_folder(Path(out_dir))
    with exclusive_target(out_dir, overwrite):
        tokenizer = _trained(documents, vocab_size)
        save_tokenizer(tokenizer, Path(out_dir))
    return load_tokenizer(out_dir)


def _check_vocab_size(vocab_size: int) -> None:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < len(alphabet) + 1:
        raise OptionError(
            f"vocab_size must be at least {len(alphabet) + 1} (every byte and the eos token), "
            f"got {vocab_size}"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise OptionError(f"vocab_size must be at most {MAX_VOCAB_SIZE:,} (token ids are 32-bit), got {vocab_size:,}")
    # The trainer's tables hold each token's bytes, its merge and its counts: far more than this.
    require(f"a vocabulary of {vocab_size:,} tokens", BYTES_PER_TOKEN_AT_LEAST * vocab_size)


def _trained(documents: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
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
    # Cleaning up spaces around punctuation on decoding would break the round trip. The pad
    # token is the eos token (id 0), as a trained model's config says (tasks.lm.mark_end_of_text).
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, clean_up_tokenization_spaces=False,
        padding_side=PADDING_SIDE,
    )


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """A tokenizer from a local directory or the Hugging Face hub; it must have an eos token.
    A model folder's (or a run's newest checkpoint's) must be the one saved with the model.
    It pads on the left (``PADDING_SIDE``), whatever its folder says, and is saved so."""
    if Path(name_or_path).is_dir():
        check_files_digest(model_folder(name_or_path))
    check_local_or_hub(name_or_path, "tokenizer")
    try:
        tokenizer = _from_pretrained(name_or_path, local_files_only=True)  # a folder, or the hub's cache
    except Exception as error:
        if Path(name_or_path).is_dir():
            raise DataError(f"{name_or_path}: cannot load a tokenizer: {first_line(error)}") from error
        unreachable = hub_unreachable(HF_ENDPOINT)
        if unreachable:
            raise DataError(f"{name_or_path}: no such tokenizer folder, nor in the hub's cache; {unreachable}") from None
        try:
            tokenizer = _from_pretrained(name_or_path, local_files_only=False)
        except Exception as error:
            raise DataError(f"{name_or_path}: cannot load a tokenizer: {first_line(error)}") from error
    if tokenizer.eos_token_id is None:
        raise DataError(
            f"{name_or_path}: the tokenizer has no eos token, which the shards need "
            f"to separate documents"
        )
    # The shards' dtype and every embedding table are sized by the length.
    largest = max(tokenizer.get_vocab().values(), default=0)
    if largest >= len(tokenizer):
        raise DataError(
            f"{name_or_path}: expected token ids below the tokenizer's length {len(tokenizer)}, "
            f"got {largest}"
        )
    return tokenizer


def _from_pretrained(name_or_path: str | os.PathLike, local_files_only: bool) -> PreTrainedTokenizerBase:
    """Loading fails in many ways (no such directory or repository, network, a malformed file),
    with exception types that differ between library versions: the caller catches them all."""
    # Never the code a tokenizer folder may name in its auto_map, not even on a yes at a prompt.
    # The padding side given here is also what save_pretrained writes (an attribute set later is not).
    # A model folder's config names a model type that transformers knows once implicitlm.models
    # is imported; the tokenizer reads none of it, so a warning that the type is unknown is noise.
    with without_log_lines("transformers.configuration_utils", "to instantiate a model of type"):
        tokenizer = AutoTokenizer.from_pretrained(
            os.fspath(name_or_path), trust_remote_code=False, local_files_only=local_files_only,
            padding_side=PADDING_SIDE,
        )
    # Where this load looked is no property of the tokenizer: transformers keeps it among the
    # arguments it saves, and every checkpoint written after a local load would say so.
    tokenizer.init_kwargs.pop("local_files_only", None)
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """``save_pretrained`` into ``out_dir``: all files are written before any replaces its
    target, so a failure while writing leaves an earlier tokenizer there as it was."""
    out_dir = Path(out_dir)
    _check_folder(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained writes in place, so its files are staged first; then each is moved
    # into place by rename, which, unlike writing, has nothing to fail on. The staging folder
    # is named as a temporary beside out_dir, which the next writer clears if this one is killed.
    beside = {"dir": out_dir.absolute().parent, "prefix": f".{out_dir.name}.", "suffix": ".tmp"}
    with tempfile.TemporaryDirectory(**beside) as staging:
        tokenizer.save_pretrained(staging)
        for staged in sorted(path for path in Path(staging).iterdir() if path.is_file()):
            atomic_write(
                out_dir / staged.name,
                lambda temporary, staged=staged: os.replace(staged, temporary),
            )


def _check_folder(out_dir: Path) -> None:
    # A file only: a pipe or a device there is refused as the writer's target (core.targets).
    if out_dir.is_file():
        raise DataError(f"{out_dir}: expected a folder for the tokenizer, got a file")
