"""The checks of what a caller hands ``ImplicitCausalLM``'s ``forward`` and ``generate``: each
argument refused in one line naming it where the passes would fail deep inside or, worse,
misread it (a mask of another shape broadcasts, an id in the padded rows of the embedding
reads a row no token was trained on, a mask of 2s counts as real tokens)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from ..core.errors import ArgumentTypeError, OptionError
from ..core.schema import NON_NEGATIVE, POSITIVE, Rule, check_field
from .loss import IGNORE_INDEX

# The inference modes a forward's ``mode`` names.
MODES = ("simultaneous", "sequential")

# Sampling divides the float32 logits by the temperature: at this one, logits up to 3.4e8
# stay within float32's range (3.4e38); below it they may overflow to inf, and the
# probabilities drawn from become NaN.
MIN_TEMPERATURE = 1e-30
# The generate() arguments that transformers divides by (num_beams), fails on deep inside
# (num_return_sequences=1.5), or takes as they are (max_new_tokens=1.5, num_return_sequences=0:
# one), read from the keywords or else from the generation config.
_COUNTS = ("num_beams", "max_new_tokens", "num_return_sequences")
# The other numbers of sampling: transformers takes top_p=1.5 or NaN as it is, and raises its
# own ValueError for a repetition_penalty of 0. A top_k of 0 keeps every token, as it reads it.
_SAMPLING_RULES = {
    "top_p": Rule("in (0, 1]", lambda share: 0 < share <= 1),
    "top_k": NON_NEGATIVE,
    "repetition_penalty": Rule("> 0 and finite", lambda penalty: 0 < penalty < float("inf")),
}


def check_forward_inputs(model, input_ids, inputs_embeds, attention_mask, state, labels) -> None:
    """The inputs of a forward of ``model``, each refused in one line naming it."""
    if (input_ids is None) == (inputs_embeds is None):
        raise OptionError("give exactly one of input_ids and inputs_embeds")
    if input_ids is not None:
        shape = check_token_ids(input_ids, model.config.vocab_size)
    else:
        shape = check_embeddings(inputs_embeds, model.config.hidden_size, model.embeddings.weight.dtype)
    if attention_mask is not None:
        check_attention_mask(attention_mask, shape)
    if state is not None:
        model.stack.check_state(state, batch=shape[0])
    if labels is not None:
        check_labels(labels, shape, model.config.vocab_size)


def check_generation_arguments(default: GenerationConfig, args: tuple, kwargs: dict[str, Any]) -> None:
    """``generate(*args, **kwargs)``'s counts, lengths and sampling numbers, given as keywords or in a
    ``generation_config`` (the second positional argument, as transformers takes it; else the
    model's ``default``): num_beams=0 divided by zero, a temperature whose logits overflow
    drew from NaN probabilities, max_new_tokens=1.5 was taken as it is (``_COUNTS``)."""
    config = kwargs.get("generation_config", args[1] if len(args) > 1 else None) or default

    def value(name: str) -> Any:
        return kwargs[name] if name in kwargs else getattr(config, name, None)

    for name in _COUNTS:
        if value(name) is not None:
            check_field("argument", name, value(name), int, POSITIVE)
    if value("max_new_tokens") is None and kwargs.get("max_length") is not None:
        # transformers counts max_length with the prompt, and raises its own ValueError when the
        # prompt fills it; without max_length it adds 20 tokens to the prompt itself.
        prompt = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
        length = prompt.shape[-1] if isinstance(prompt, torch.Tensor) and prompt.dim() == 2 else 0
        check_field("argument", "max_length", kwargs["max_length"], int,
                    Rule(f"> {length}, the prompt's length, which it counts (max_new_tokens counts the new tokens only)",
                         lambda total: total > length))
    for name, rule in _SAMPLING_RULES.items():
        if value(name) is not None:
            check_field("argument", name, value(name), int if name == "top_k" else float, rule)
    if value("temperature") is not None:
        check_field("argument", "temperature", value("temperature"), float,
                    Rule(f">= {MIN_TEMPERATURE:g} (a lower one overflows the logits; do_sample=False takes the most "
                         "likely tokens)",
                         lambda temperature: temperature >= MIN_TEMPERATURE))


def check_token_ids(input_ids, vocab_size: int) -> tuple[int, int]:
    """``input_ids``: (batch, length) integer ids in [0, ``vocab_size``), at least one of
    each; returns the shape."""
    integer = isinstance(input_ids, torch.Tensor) and input_ids.dtype in (torch.int64, torch.int32)
    if not integer or input_ids.dim() != 2:
        raise OptionError(f"input_ids must be a 2-d tensor of integer token ids (batch, length); got {_described(input_ids)}")
    if input_ids.numel() == 0:
        raise OptionError(f"input_ids must hold at least one row of at least one token; got shape {_shape(input_ids)}")
    low, high = (int(bound) for bound in torch.aminmax(input_ids))
    if low < 0 or high >= vocab_size:
        raise OptionError(f"input_ids must lie in [0, {vocab_size}), the vocabulary; got {low if low < 0 else high}")
    return _shape(input_ids)


def check_labels(labels, shape: tuple[int, int], vocab_size: int) -> None:
    """``labels``: integer ids in [0, ``vocab_size``), or ``IGNORE_INDEX`` where no loss is
    taken, of the input's ``shape``."""
    integer = isinstance(labels, torch.Tensor) and labels.dtype in (torch.int64, torch.int32)
    if not integer or _shape(labels) != shape:
        raise OptionError(f"labels must be a tensor of integer token ids of the input's shape {shape}; got {_described(labels)}")
    outside = (labels >= vocab_size) | ((labels < 0) & (labels != IGNORE_INDEX))
    if bool(outside.any()):
        raise OptionError(f"labels must lie in [0, {vocab_size}), the vocabulary, or be {IGNORE_INDEX} (no loss); "
                          f"got {int(labels[outside][0])}")


def check_embeddings(inputs_embeds, hidden_size: int, dtype: torch.dtype) -> tuple[int, int]:
    """``inputs_embeds``: (batch, length, ``hidden_size``) floats of the model's ``dtype``, at
    least one token in at least one row; returns (batch, length)."""
    if not (isinstance(inputs_embeds, torch.Tensor) and inputs_embeds.dtype == dtype
            and inputs_embeds.dim() == 3 and inputs_embeds.shape[-1] == hidden_size):
        raise OptionError(f"inputs_embeds must be a {str(dtype).removeprefix('torch.')} tensor (batch, length, "
                          f"{hidden_size}), of the model's dtype and width; got {_described(inputs_embeds)}")
    if inputs_embeds.numel() == 0:
        raise OptionError(f"inputs_embeds must hold at least one row of at least one token; got shape {_shape(inputs_embeds)}")
    return _shape(inputs_embeds)[:2]


def check_attention_mask(attention_mask, shape: tuple[int, int]) -> None:
    """``attention_mask``: 1 at real tokens, 0 at padding, of the input's ``shape``."""
    if not (isinstance(attention_mask, torch.Tensor) and _shape(attention_mask) == shape):
        raise OptionError(f"attention_mask must be a tensor of the input's shape {shape}; got {_described(attention_mask)}")
    other = (attention_mask != 0) & (attention_mask != 1)
    if bool(other.any()):
        raise OptionError(f"attention_mask must hold 1 at real tokens and 0 at padding; got {attention_mask[other][0].item()!r}")


def pads_after_real_tokens(attention_mask: torch.Tensor) -> bool:
    """Whether a row of ``attention_mask`` has padding after one of its real tokens (right
    padding, or a gap): the state after the row's last position then holds padding."""
    real = attention_mask != 0
    return bool((real[:, :-1] & ~real[:, 1:]).any())


def left_aligned(attention_mask: torch.Tensor | None, rows: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``attention_mask`` and ``rows`` (its (batch, length, ...) token ids or embeddings) with
    each row's padding moved in front of its real tokens, which keep their order. Generation
    continues every row from its last position, so a right-padded prompt would be continued
    from its padding; left-aligned, each row is continued as it is alone."""
    if attention_mask is None:
        return attention_mask, rows
    check_attention_mask(attention_mask, _shape(rows)[:2])
    if not pads_after_real_tokens(attention_mask):
        return attention_mask, rows
    order = (attention_mask != 0).to(torch.uint8).argsort(dim=1, stable=True)
    index = order.view(*order.shape, *[1] * (rows.dim() - 2)).expand_as(rows)
    return attention_mask.gather(1, order), rows.gather(1, index)


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def _described(value) -> str:
    """A tensor argument, for a message: its shape and dtype, or what it is instead."""
    if isinstance(value, torch.Tensor):
        return f"shape {_shape(value)}, {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def check_position_ids(position_ids: torch.Tensor, padding: torch.Tensor | None, continues: bool) -> None:
    """Positions here follow from the order of the real tokens: a recurrence has no other,
    and attention rotates each token by the real tokens before it, which is what
    transformers' ``generate`` computes from a left-padded mask. ``position_ids`` that say
    the same are accepted; others (packed documents, gaps, offsets) would be silently
    ignored, so they are refused. Continuing a ``state``, only their steps are checked."""
    real = padding if padding is not None else torch.ones(position_ids.shape[-1], dtype=torch.bool, device=position_ids.device)
    real = real.expand(*position_ids.shape[:-1], -1) if real.dim() == 1 else real
    position_ids = position_ids.expand_as(real)
    expected = real.long().cumsum(dim=-1) - 1
    if continues:
        first_real = real.long().argmax(dim=-1, keepdim=True)
        expected = expected + position_ids.gather(-1, first_real)
    if bool((position_ids != expected)[real].any()):
        raise OptionError(
            "position_ids must number the real tokens 0, 1, 2, ... (after left padding, as generate() computes them); "
            "other positions are not supported: the model's positions follow from token order"
        )


# transformers' per-call options (TransformersKwargs, besides the ones forward names): what
# each needs from this model. Packed sequences and attention weights it cannot give, so
# asking for them is refused rather than ignored.
_PACKED_SEQUENCE_OPTIONS = ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")
_TRANSFORMERS_OPTIONS = {"num_items_in_batch", "output_attentions", "output_router_logits", "is_causal",
                         "max_length_q", "max_length_k", *_PACKED_SEQUENCE_OPTIONS}


def transformers_options(options: dict) -> int | torch.Tensor | None:
    """Check the per-call options a forward got from transformers; returns ``num_items_in_batch``."""
    unknown = sorted(set(options) - _TRANSFORMERS_OPTIONS)
    if unknown:
        raise ArgumentTypeError(f"forward() got unexpected keyword argument(s): {', '.join(unknown)}")
    if options.get("output_attentions"):
        raise OptionError("output_attentions is not supported: Mamba mixers have no attention weights and attention runs in SDPA")
    if options.get("output_router_logits"):
        raise OptionError("output_router_logits is not supported: the model has no router")
    if options.get("is_causal") is False:
        raise OptionError("is_causal=False is not supported: the model is causal")
    packed = [name for name in _PACKED_SEQUENCE_OPTIONS if options.get(name) is not None]
    if packed:
        raise OptionError(f"packed sequences ({packed[0]}) are not supported: give one sequence per row, padded with attention_mask")
    return options.get("num_items_in_batch")


def kept_positions(logits_to_keep: int | torch.Tensor, labels: torch.Tensor | None) -> slice | torch.Tensor:
    """The positions whose logits a forward computes: the head over a vocabulary costs as
    much as a small model's blocks, and a scorer or a generator needs a few positions only."""
    if isinstance(logits_to_keep, torch.Tensor):
        if logits_to_keep.dim() != 1 or logits_to_keep.is_floating_point():
            raise OptionError(f"logits_to_keep as a tensor lists positions (1-d integers); got shape {tuple(logits_to_keep.shape)}")
    elif isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
        raise OptionError(f"logits_to_keep must be a non-negative integer or a tensor of positions; got {logits_to_keep!r}")
    elif logits_to_keep == 0:
        return slice(None)
    if labels is not None:
        raise OptionError("a loss needs the logits of every position: give labels with logits_to_keep=0")
    return logits_to_keep if isinstance(logits_to_keep, torch.Tensor) else slice(-logits_to_keep, None)
