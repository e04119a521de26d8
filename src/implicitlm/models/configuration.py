"""The configuration every backbone family shares (``ImplicitLMConfig``) and the checks the
families' configs run on their fields; each family's own config lies in its folder
(``mamba2/configuration_mamba2.py``, ``llama/configuration_llama.py``, ``mamba/configuration_mamba.py``)."""

from __future__ import annotations

import typing
from typing import Any

import torch
from transformers import PretrainedConfig

from ..core.migrations import fixed_point_options
from ..deq.options import FixedPointOptions
from ..core.schema import NON_NEGATIVE, POSITIVE, at_least, check_fields, one_of, option_error

LABEL_ALIGNMENTS = ("shifted", "aligned")
WHAT = "model option"


class ImplicitLMConfig(PretrainedConfig):
    """What every backbone family shares: vocabulary, width, depth, implicit or not, the loss.

    A stack is run once (``implicit=False``) or iterated to a fixed point (``implicit=True``).
    Field names follow transformers' configs where the meaning is the same.
    ``label_alignment``: "shifted" for next-token prediction (label t is token t + 1),
    "aligned" when label t already belongs to position t (word problems: the running
    product including token t). ``fixed_point``: a dict of ``FixedPointOptions`` fields.
    ``tie_word_embeddings=False`` gives the model a head of its own (``lm_head``) instead of
    reading logits off the embedding matrix.

    Each class checks its own ``__init__`` arguments against their annotations and its
    ``FIELD_RULES`` before using them, whether they come from options or a config.json.
    ``check_consistency`` checks the fields that constrain one another (head sizes): a
    config with some defaults left may not pass it (``ImplicitLlamaConfig(hidden_size=1024)``
    keeps 12 heads), so ``config_from_options`` and ``load_model`` call it, not ``__init__``.
    """

    FIELD_RULES = {
        "vocab_size": at_least(1), "hidden_size": at_least(1), "num_hidden_layers": at_least(1),
        "pad_vocab_size_multiple": at_least(1), "layer_norm_epsilon": POSITIVE, "initializer_range": NON_NEGATIVE,
        "label_alignment": one_of(*LABEL_ALIGNMENTS),
    }
    # What each field means, for --help.
    FIELD_HELP = {
        "vocab_size": "tokens in the vocabulary",
        "hidden_size": "width of the residual stream",
        "num_hidden_layers": "blocks in the stack",
        "implicit": "iterate the stack to a fixed point (false: one pass)",
        "weight_norm": "implicit: weight norm on the stack's weights",
        "pad_vocab_size_multiple": "embedding rows padded to a multiple of this",
        "layer_norm_epsilon": "RMSNorm epsilon",
        "initializer_range": "std of the normal initialisation of embeddings (and Llama's linear layers)",
        "label_alignment": "shifted (next-token labels) or aligned (label t belongs to token t: word problems)",
        "fixed_point": "a JSON object of fixed-point options (below), e.g. fixed_point='{\"max_iter\": 64}'",
        "tie_word_embeddings": "read logits off the embedding matrix (false: a head of its own)",
    }

    def __init__(
        self, vocab_size: int = 50277, hidden_size: int = 768, num_hidden_layers: int = 24, implicit: bool = True,
        weight_norm: bool = True, pad_vocab_size_multiple: int = 16, layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02, label_alignment: str = "shifted",
        fixed_point: dict[str, Any] | None = None, tie_word_embeddings: bool = True, **kwargs: Any,
    ) -> None:
        set_arguments(self, ImplicitLMConfig, locals())
        check_dtype_names(kwargs)
        self.fixed_point = FixedPointOptions.from_dict(fixed_point_options(fixed_point or {})).to_dict()
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def check_consistency(self) -> None:
        """Raise OptionError for fields that do not fit together (none in the shared ones)."""

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.pad_vocab_size_multiple
        return -(-self.vocab_size // multiple) * multiple

    @property
    def fixed_point_options(self) -> FixedPointOptions:
        return FixedPointOptions.from_dict(self.fixed_point)


def set_arguments(config: ImplicitLMConfig, cls: type[ImplicitLMConfig], arguments: dict[str, Any]) -> None:
    """Check the arguments of ``cls.__init__`` (``locals()`` on entry) that ``cls`` declares,
    before anything is computed from them, and set each as a field of ``config``; a field
    that needs resolving (a default that depends on another) is set again after."""
    hints = typing.get_type_hints(cls.__init__)
    check_fields(arguments, hints, cls.FIELD_RULES, WHAT)
    for name in hints:
        if name != "return" and name != "kwargs":
            setattr(config, name, arguments[name])


def check_dtype_names(fields: dict[str, Any]) -> None:
    """A config's ``dtype`` (``torch_dtype``, as transformers spelt it before) names a floating
    torch dtype: transformers reads a name it does not know as no dtype at all, or fails deep inside."""
    for key in ("dtype", "torch_dtype"):
        value = fields.get(key)
        named = getattr(torch, value, None) if isinstance(value, str) else value
        if value is not None and not (isinstance(named, torch.dtype) and named.is_floating_point):
            raise option_error(WHAT, key, "the name of a floating dtype (float32, bfloat16, ...) or null", value)


def check_time_steps(config: ImplicitLMConfig) -> None:
    """Raise OptionError when a config's ``time_step_min`` exceeds its ``time_step_max``
    (the Mamba2 and Mamba1 configs)."""
    if config.time_step_min > config.time_step_max:
        raise option_error(WHAT, "time_step_min", f"<= time_step_max = {config.time_step_max}", config.time_step_min)
