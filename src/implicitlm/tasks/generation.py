"""Text from a language model: a prompt in, its continuation out, handed over as it is decoded.

The model's own ``generate`` does the work: the prompt is solved in ``mode`` (simultaneous
by default: one fixed point over the whole prompt), then each new token is one sequential
step from the state the prompt left, as an RNN. Tokens are sampled (transformers' defaults:
temperature 1, top-k 50, top-p 1) unless ``greedy``; a ``seed`` makes sampling repeatable.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import TextStreamer

from ..core.atomic_io import atomic_write
from ..core.devices import usable_device
from ..core.duration import require_time, seconds_of
from ..core.errors import DataError, OptionError
from ..core.json_file import check_regular
from ..core.targets import exclusive_target
from ..deq import ConvergenceTally
from ..models import ImplicitCausalLM, load_model
from ..models.implicit_lm import MODES
from ..models.argument_checks import MIN_TEMPERATURE
from ..models.loading import torch_dtype
from .lm import model_tokenizer

DEFAULT_MAX_NEW_TOKENS = 100
# transformers' own defaults for sampling, given explicitly: a checkpoint's
# generation_config.json would otherwise choose them.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
# Between the sequences of one prompt, in what is printed and written.
SEQUENCE_SEPARATOR = "---\n"
STDIN = "-"
# Bytes of a prompt file (characters on standard input) read at most: millions of tokens,
# beyond any context a model here is trained or run on; /dev/zero would never end.
MAX_PROMPT_LENGTH = 16 * 2**20

# Called with each piece of text as it is decoded: all the pieces, joined, are ``format_texts``'s.
OnText = Callable[[str], None]


@dataclass(frozen=True)
class Decoding:
    """How new tokens are chosen. Sampling options left None take ``SAMPLING_DEFAULTS``."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        _check(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", "a positive integer",
               self.max_new_tokens)
        _check(_is_int(self.num_return_sequences) and self.num_return_sequences >= 1, "num_return_sequences",
               "a positive integer", self.num_return_sequences)
        _check(self.seed is None or (_is_int(self.seed) and self.seed >= 0), "seed", "an integer >= 0", self.seed)
        _check(self.temperature is None or (_is_number(self.temperature) and self.temperature >= MIN_TEMPERATURE),
               "temperature", f"a number >= {MIN_TEMPERATURE:g} (a lower one overflows the logits; greedy decoding "
               "takes the most likely tokens)", self.temperature)
        _check(self.top_k is None or (_is_int(self.top_k) and self.top_k >= 1), "top_k", "a positive integer",
               self.top_k)
        _check(self.top_p is None or (_is_number(self.top_p) and 0 < self.top_p <= 1), "top_p", "a number in (0, 1]",
               self.top_p)
        if self.greedy:
            given = [name for name in SAMPLING_DEFAULTS if getattr(self, name) is not None]
            if given:
                raise OptionError(f"greedy decoding takes the most likely token; {', '.join(given)} "
                                  f"{'applies' if len(given) == 1 else 'apply'} to sampling only")
            if self.num_return_sequences > 1:
                raise OptionError("greedy decoding gives one text per prompt; num_return_sequences > 1 needs sampling")

    def generate_options(self) -> dict[str, Any]:
        """The keywords of ``generate`` that choose the tokens."""
        if self.greedy:
            return {"do_sample": False, "max_new_tokens": self.max_new_tokens}
        chosen = {name: getattr(self, name) for name in SAMPLING_DEFAULTS if getattr(self, name) is not None}
        return {"do_sample": True, "max_new_tokens": self.max_new_tokens, **SAMPLING_DEFAULTS, **chosen}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check(holds: bool, name: str, expected: str, value: Any) -> None:
    if not holds:
        raise OptionError(f"{name} must be {expected}; got {value!r}")


def read_prompt(source: str | Path) -> str:
    """The prompt in a text file (UTF-8), or on standard input for ``-``; the line break
    that ends a file's last line is no part of it."""
    if str(source) == STDIN:
        text = sys.stdin.read(MAX_PROMPT_LENGTH + 1)
    else:
        check_regular(Path(source), "a prompt file")
        with open(source, "rb") as file:
            text = file.read(MAX_PROMPT_LENGTH + 1)
    if len(text) > MAX_PROMPT_LENGTH:
        raise DataError(f"{source}: a prompt of more than {MAX_PROMPT_LENGTH // 2**20} MiB; no model here reads that much")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{source}: not UTF-8 text (byte {error.start})") from None
    return text[:-1] if text.endswith("\n") else text


def generate_text(
    model: str | Path | ImplicitCausalLM,
    prompt: str,
    decoding: Decoding = Decoding(),
    tokenizer: Any = None,
    mode: str = "simultaneous",
    fixed_point: dict[str, Any] | None = None,
    dtype: str | torch.dtype | None = None,
    device: str = "cpu",
    on_text: OnText | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    echo_prompt: bool = False,
    cuda_graphs: bool | None = None,
    convergence: ConvergenceTally | None = None,
) -> list[str]:
    """The continuations of ``prompt`` (``decoding.num_return_sequences`` of them) by ``model``
    (a checkpoint or run folder, or a loaded model), without the prompt.

    ``tokenizer``: a folder, hub name or tokenizer (default: the one saved with the
    checkpoint). ``mode``: how the prompt is solved. ``fixed_point``: ``FixedPointOptions``
    fields that every forward of the generation runs with (``max_iter``, ``tol``, ``solver``,
    ``chunk_length``); a model given keeps its own options.
    ``on_text``: called with each piece of text as it is decoded. ``out``: a file the texts
    are also written to, as ``format_texts`` joins them (an existing one is refused before
    anything is generated, unless ``overwrite``). ``echo_prompt``: what ``on_text`` and ``out``
    get starts each text with the prompt, as a reader of the text expects. ``cuda_graphs``: as
    the model's ``generate`` takes it (default: each token's fixed passes replayed from a
    captured graph on a CUDA device). ``convergence``: a tally that counts the fixed points of
    every sequence (no warning is then logged: its holder reports them)."""
    if not isinstance(prompt, str) or not prompt:
        raise OptionError("the prompt is empty: give the text to continue")
    if mode not in MODES:
        raise OptionError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    device = usable_device(device)
    with exclusive_target(out, overwrite) if out is not None else contextlib.nullcontext():
        if isinstance(model, (str, Path)):
            model = load_model(model, dtype=dtype)
        model.to(device=device, dtype=torch_dtype(dtype)).eval()
        tokenizer = model_tokenizer(model, tokenizer)
        shown = prompt if echo_prompt else ""
        texts = _generate(model, tokenizer, _prompt_ids(prompt, tokenizer, model), decoding, mode, on_text, shown,
                          cuda_graphs, convergence, fixed_point)
        if out is not None:
            written = format_texts([shown + text for text in texts])
            atomic_write(out, lambda temporary: temporary.write_text(written, encoding="utf-8"))
    return texts


def format_texts(texts: list[str]) -> str:
    """The texts of one prompt as printed: each on its own lines, ``SEQUENCE_SEPARATOR`` between."""
    return SEQUENCE_SEPARATOR.join(f"{text}\n" for text in texts)


def _prompt_ids(prompt: str, tokenizer, model: ImplicitCausalLM) -> torch.Tensor:
    ids = tokenizer.encode(prompt, add_special_tokens=False, return_tensors="pt")
    if ids.numel() == 0:
        raise OptionError("the prompt is no tokens: give the text to continue")
    if int(ids.max()) >= model.config.vocab_size:
        raise OptionError(f"the tokenizer gives token id {int(ids.max())}, past the model's vocab_size "
                          f"{model.config.vocab_size}: not the tokenizer the model was trained with")
    return ids.to(model.device)


@torch.no_grad()
def _generate(
    model, tokenizer, ids: torch.Tensor, decoding: Decoding, mode: str, on_text: OnText | None, shown: str = "",
    cuda_graphs: bool | None = None, convergence: ConvergenceTally | None = None,
    fixed_point: dict[str, Any] | None = None,
) -> list[str]:
    """One sequence at a time, so that each streams as it is decoded (transformers' streamers
    take one row), ``shown`` before each; the seed's random state is this call's alone.
    ``convergence``: counts the fixed points of the sequences (not of the timing probe's);
    ``fixed_point``: the options of every forward (the model's own left as they are)."""
    options = {**decoding.generate_options(), "mode": mode, "attention_mask": torch.ones_like(ids),
               "cuda_graphs": cuda_graphs, "fixed_point": fixed_point}
    # A model trained here stops at its tokenizer's end of text (tasks.lm.mark_end_of_text); one
    # imported may name none, and transformers would then warn at every call.
    for setting in ("eos_token_id", "pad_token_id"):
        if getattr(model.generation_config, setting) is None:
            options[setting] = tokenizer.eos_token_id
    _require_time(model, ids, options, decoding.num_return_sequences)
    texts = []
    devices = [model.device] if model.device.type == "cuda" else []
    tracked = contextlib.nullcontext() if convergence is None else model.track_convergence(convergence)
    with torch.random.fork_rng(devices=devices, enabled=decoding.seed is not None), tracked:
        if decoding.seed is not None:
            torch.manual_seed(decoding.seed)
        for index in range(decoding.num_return_sequences):
            if index and on_text is not None:
                on_text(SEQUENCE_SEPARATOR)
            if shown and on_text is not None:
                on_text(shown)
            streamer = _Streamer(tokenizer, on_text) if on_text is not None else None
            generated = model.generate(ids, streamer=streamer, **options)
            texts.append(tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


def _require_time(model, ids: torch.Tensor, options: dict[str, Any], sequences: int) -> None:
    """Refuse, before the first is decoded, more sequences than ``require_time`` allows: each
    solves the prompt and decodes at least a token, timed on one: greedy, which leaves the
    seeded random state alone, and a probe (each solve at its first evaluation, counted as
    converged, so that no warning is logged of it)."""
    if sequences > 1:
        one_token = {**options, "do_sample": False, "max_new_tokens": 1, "probe": True}
        for setting in SAMPLING_DEFAULTS:
            one_token.pop(setting, None)
        seconds = seconds_of(lambda: model.generate(ids, **one_token))
        require_time(f"{sequences:,} sequences", sequences * seconds, arguments=("num_return_sequences",),
                     hint="; ask for fewer num_return_sequences")


class _Streamer(TextStreamer):
    """transformers' ``TextStreamer`` (whole words, the prompt skipped), handing its text to
    ``on_text`` instead of printing it; a line break ends the sequence, as ``format_texts``'s."""

    def __init__(self, tokenizer, on_text: OnText):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self._on_text = on_text

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self._on_text(f"{text}\n" if stream_end else text)
