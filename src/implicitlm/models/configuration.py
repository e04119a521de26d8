"""Configuration of implicit and explicit Mamba2 language models."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from ..deq.options import FixedPointOptions

LABEL_ALIGNMENTS = ("shifted", "aligned")


class ImplicitMamba2Config(PretrainedConfig):
    """Mamba2 stack run once (``implicit=False``) or iterated to a fixed point (``implicit=True``).

    Field names follow ``transformers.Mamba2Config`` where the meaning is the same.
    ``label_alignment``: "shifted" for next-token prediction (label t is token t + 1),
    "aligned" when label t already belongs to position t (word problems: the running
    product including token t). ``fixed_point``: a dict of ``FixedPointOptions`` fields.
    """

    model_type = "implicit_mamba2"

    def __init__(
        self,
        vocab_size: int = 50277,
        hidden_size: int = 768,
        num_hidden_layers: int = 24,
        state_size: int = 128,
        conv_kernel: int = 4,
        expand: int = 2,
        head_dim: int = 64,
        n_groups: int = 1,
        chunk_size: int = 256,
        implicit: bool = True,
        weight_norm: bool = True,
        pad_vocab_size_multiple: int = 16,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        time_step_min: float = 1e-3,
        time_step_max: float = 0.1,
        a_init_range: tuple[float, float] = (1.0, 16.0),
        label_alignment: str = "shifted",
        fixed_point: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        if label_alignment not in LABEL_ALIGNMENTS:
            raise ValueError(f"label_alignment must be one of {LABEL_ALIGNMENTS}, got {label_alignment!r}")
        if not tie_word_embeddings:
            raise ValueError("only tied input/output embeddings are supported (tie_word_embeddings=True)")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.state_size = state_size
        self.conv_kernel = conv_kernel
        self.expand = expand
        self.head_dim = head_dim
        self.n_groups = n_groups
        self.chunk_size = chunk_size
        self.implicit = implicit
        self.weight_norm = weight_norm
        self.pad_vocab_size_multiple = pad_vocab_size_multiple
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.time_step_min = time_step_min
        self.time_step_max = time_step_max
        self.a_init_range = tuple(a_init_range)
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
