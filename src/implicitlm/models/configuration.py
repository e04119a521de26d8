"""Configuration of implicit and explicit language models: Mamba2, Llama and Mamba (Mamba1) backbones."""

from __future__ import annotations

import math
from typing import Any

from transformers import PretrainedConfig

from ..deq.options import FixedPointOptions
from ..layers.mlp import swiglu_hidden_size

LABEL_ALIGNMENTS = ("shifted", "aligned")


class ImplicitLMConfig(PretrainedConfig):
    """What every backbone family shares: vocabulary, width, depth, implicit or not, the loss.

    A stack is run once (``implicit=False``) or iterated to a fixed point (``implicit=True``).
    Field names follow transformers' configs where the meaning is the same.
    ``label_alignment``: "shifted" for next-token prediction (label t is token t + 1),
    "aligned" when label t already belongs to position t (word problems: the running
    product including token t). ``fixed_point``: a dict of ``FixedPointOptions`` fields.
    ``tie_word_embeddings=False`` gives the model a head of its own (``lm_head``) instead of
    reading logits off the embedding matrix.
    """

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
        if label_alignment not in LABEL_ALIGNMENTS:
            raise ValueError(f"label_alignment must be one of {LABEL_ALIGNMENTS}, got {label_alignment!r}")
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


class ImplicitLlamaConfig(ImplicitLMConfig):
    """Llama blocks (attention with RoPE + SwiGLU MLP); field names follow ``transformers.LlamaConfig``.

    ``num_key_value_heads`` None means one key/value head per query head (no grouping);
    ``intermediate_size`` None means the authors' floor(2 * 4 * hidden_size / 3). The head
    size is hidden_size // num_attention_heads.
    """

    model_type = "implicit_llama"

    def __init__(
        self,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        num_key_value_heads: int | None = None,
        intermediate_size: int | None = None,
        rope_theta: float = 5e5,
        **kwargs: Any,
    ) -> None:
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.rope_theta = rope_theta
        super().__init__(num_hidden_layers=num_hidden_layers, **kwargs)
        # Resolved after the shared fields are set: the default depends on hidden_size.
        if intermediate_size is None:
            intermediate_size = swiglu_hidden_size(self.hidden_size)
        self.intermediate_size = intermediate_size


class ImplicitMambaConfig(ImplicitLMConfig):
    """Mamba1 blocks (no MLP); field names follow ``transformers.MambaConfig``.

    ``time_step_rank``: the rank of dt's projection, "auto" for ceil(hidden_size / 16).
    ``chunk_size``: the chunk length of the parallel scan; it changes the cost (work and
    memory grow with its square), not the function.
    """

    model_type = "implicit_mamba"

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
