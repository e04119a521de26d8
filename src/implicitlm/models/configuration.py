"""Configuration of implicit and explicit language models: Mamba2, Llama and Mamba (Mamba1) backbones."""

from __future__ import annotations

import math
import typing
from typing import Any

from transformers import PretrainedConfig

from ..deq.options import FixedPointOptions
from ..layers.mlp import swiglu_hidden_size
from ..core.schema import NON_NEGATIVE, POSITIVE, Rule, at_least, check_fields, one_of, option_error

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
        "fixed_point": "a JSON object of fixed-point options (below), e.g. fixed_point='{\"eval_f_max_iter\": 64}'",
        "tie_word_embeddings": "read logits off the embedding matrix (false: a head of its own)",
    }

    def __init__(
        self,
        vocab_size: int = 50277,
        hidden_size: int = 768,
        num_hidden_layers: int = 24,
        implicit: bool = True,
        weight_norm: bool = True,
        pad_vocab_size_multiple: int = 16,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        label_alignment: str = "shifted",
        fixed_point: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        _check_arguments(ImplicitLMConfig, locals())
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.implicit = implicit
        self.weight_norm = weight_norm
        self.pad_vocab_size_multiple = pad_vocab_size_multiple
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.label_alignment = label_alignment
        self.fixed_point = FixedPointOptions.from_dict(fixed_point or {}).to_dict()
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


class ImplicitMamba2Config(ImplicitLMConfig):
    """Mamba2 blocks (no MLP); field names follow ``transformers.Mamba2Config``."""

    model_type = "implicit_mamba2"
    FIELD_RULES = {
        "state_size": at_least(1), "conv_kernel": at_least(1), "expand": at_least(1), "head_dim": at_least(1),
        "n_groups": at_least(1), "chunk_size": at_least(1), "time_step_min": POSITIVE, "time_step_max": POSITIVE,
        "a_init_range": Rule("with 0 < low <= high", lambda bounds: 0 < bounds[0] <= bounds[1]),
    }
    FIELD_HELP = {
        "state_size": "SSM state per head (N)",
        "conv_kernel": "width of the causal convolution",
        "expand": "inner width = expand x hidden_size",
        "head_dim": "width of a head (P); heads = inner width / head_dim",
        "n_groups": "groups sharing B and C",
        "chunk_size": "chunk length of the parallel SSD scan (cost, not function)",
        "time_step_min": "smallest initial time step",
        "time_step_max": "largest initial time step",
        "a_init_range": "range of the initial decay rates A",
    }

    def __init__(
        self,
        state_size: int = 128,
        conv_kernel: int = 4,
        expand: int = 2,
        head_dim: int = 64,
        n_groups: int = 1,
        chunk_size: int = 256,
        time_step_min: float = 1e-3,
        time_step_max: float = 0.1,
        a_init_range: tuple[float, float] = (1.0, 16.0),
        **kwargs: Any,
    ) -> None:
        _check_arguments(ImplicitMamba2Config, locals())
        self.state_size = state_size
        self.conv_kernel = conv_kernel
        self.expand = expand
        self.head_dim = head_dim
        self.n_groups = n_groups
        self.chunk_size = chunk_size
        self.time_step_min = time_step_min
        self.time_step_max = time_step_max
        self.a_init_range = tuple(a_init_range)
        super().__init__(**kwargs)

    def check_consistency(self) -> None:
        _check_time_steps(self)
        inner = self.expand * self.hidden_size
        if inner % self.head_dim:
            raise option_error(WHAT, "head_dim", f"a divisor of expand * hidden_size = {inner}", self.head_dim)
        if (inner // self.head_dim) % self.n_groups:
            heads = f"expand * hidden_size / head_dim = {inner // self.head_dim}"
            raise option_error(WHAT, "n_groups", f"a divisor of the number of heads {heads}", self.n_groups)


class ImplicitLlamaConfig(ImplicitLMConfig):
    """Llama blocks (attention with RoPE + SwiGLU MLP); field names follow ``transformers.LlamaConfig``.

    ``num_key_value_heads`` None means one key/value head per query head (no grouping);
    ``intermediate_size`` None means the authors' floor(2 * 4 * hidden_size / 3). The head
    size is hidden_size // num_attention_heads.
    """

    model_type = "implicit_llama"
    FIELD_RULES = {
        "num_attention_heads": at_least(1), "num_key_value_heads": at_least(1), "intermediate_size": at_least(1),
        "rope_theta": POSITIVE,
    }
    FIELD_HELP = {
        "num_hidden_layers": "blocks in the stack",
        "num_attention_heads": "query heads",
        "num_key_value_heads": "key/value heads (null: one per query head)",
        "intermediate_size": "MLP width (null: floor(8 x hidden_size / 3))",
        "rope_theta": "RoPE base",
    }

    def __init__(
        self,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        num_key_value_heads: int | None = None,
        intermediate_size: int | None = None,
        rope_theta: float = 5e5,
        **kwargs: Any,
    ) -> None:
        _check_arguments(ImplicitLlamaConfig, locals())
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.rope_theta = rope_theta
        super().__init__(num_hidden_layers=num_hidden_layers, **kwargs)
        # Resolved after the shared fields are set: the default depends on hidden_size.
        if intermediate_size is None:
            intermediate_size = swiglu_hidden_size(self.hidden_size)
        self.intermediate_size = intermediate_size

    def check_consistency(self) -> None:
        heads, kv_heads, size = self.num_attention_heads, self.num_key_value_heads, self.hidden_size
        if size % heads or (size // heads) % 2:
            # RoPE rotates pairs of dimensions: a head's size must be even.
            expected = f"a divisor of hidden_size = {size} into heads of even size"
            raise option_error(WHAT, "num_attention_heads", expected, heads)
        if heads % kv_heads:
            raise option_error(WHAT, "num_key_value_heads", f"a divisor of num_attention_heads = {heads}", kv_heads)


class ImplicitMambaConfig(ImplicitLMConfig):
    """Mamba1 blocks (no MLP); field names follow ``transformers.MambaConfig``.

    ``time_step_rank``: the rank of dt's projection, "auto" for ceil(hidden_size / 16).
    ``chunk_size``: the chunk length of the parallel scan; it changes the cost (work and
    memory grow with its square), not the function.
    """

    model_type = "implicit_mamba"
    FIELD_RULES = {
        "state_size": at_least(1), "conv_kernel": at_least(1), "expand": at_least(1), "chunk_size": at_least(1),
        "time_step_min": POSITIVE, "time_step_max": POSITIVE,
        "time_step_rank": Rule(
            "an integer >= 1 or 'auto'",
            lambda rank: rank == "auto" or isinstance(rank, int) and rank >= 1,
            replaces_type=True,
        ),
    }
    FIELD_HELP = {
        "state_size": "SSM state per channel (N)",
        "conv_kernel": "width of the causal convolution",
        "expand": "inner width = expand x hidden_size",
        "time_step_rank": "rank of the time step's projection (auto: ceil(hidden_size / 16))",
        "time_step_min": "smallest initial time step",
        "time_step_max": "largest initial time step",
        "chunk_size": "chunk length of the parallel scan (cost, not function)",
    }

    def __init__(
        self,
        state_size: int = 16,
        conv_kernel: int = 4,
        expand: int = 2,
        time_step_rank: int | str = "auto",
        time_step_min: float = 1e-3,
        time_step_max: float = 0.1,
        chunk_size: int = 4,
        **kwargs: Any,
    ) -> None:
        _check_arguments(ImplicitMambaConfig, locals())
        self.state_size = state_size
        self.conv_kernel = conv_kernel
        self.expand = expand
        self.time_step_min = time_step_min
        self.time_step_max = time_step_max
        self.chunk_size = chunk_size
        super().__init__(**kwargs)
        # Resolved after the shared fields are set: "auto" depends on hidden_size.
        if time_step_rank == "auto":
            time_step_rank = math.ceil(self.hidden_size / 16)
        self.time_step_rank = time_step_rank

    def check_consistency(self) -> None:
        _check_time_steps(self)


def _check_arguments(cls: type[ImplicitLMConfig], arguments: dict[str, Any]) -> None:
    """Check the arguments of ``cls.__init__`` (``locals()`` on entry) that ``cls`` declares,
    before anything is computed from them."""
    check_fields(arguments, typing.get_type_hints(cls.__init__), cls.FIELD_RULES, WHAT)


def _check_time_steps(config: ImplicitMamba2Config | ImplicitMambaConfig) -> None:
    if config.time_step_min > config.time_step_max:
        raise option_error(WHAT, "time_step_min", f"<= time_step_max = {config.time_step_max}", config.time_step_min)
