"""Layers with a parallel form and a one-token step form; they know no model."""

from .attention import AttentionDims, CausalSelfAttention, KVCache
from .mamba2 import Mamba2Dims, Mamba2Mixer, Mamba2State
from .mlp import SwiGLUMLP, swiglu_hidden_size
from .norms import GatedRMSNorm, RMSNorm
from .rotary import apply_rotary, rotary_cos_sin, rotary_cos_sin_at
from .ssd import ssd_chunked, ssd_reference, ssd_step

__all__ = [
    "AttentionDims",
    "CausalSelfAttention",
    "GatedRMSNorm",
    "KVCache",
    "Mamba2Dims",
    "Mamba2Mixer",
    "Mamba2State",
    "RMSNorm",
    "SwiGLUMLP",
    "apply_rotary",
    "rotary_cos_sin",
    "rotary_cos_sin_at",
    "ssd_chunked",
    "ssd_reference",
    "ssd_step",
    "swiglu_hidden_size",
]
