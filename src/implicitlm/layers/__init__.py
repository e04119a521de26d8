"""Layers with a parallel form and a one-token step form; they know no model."""

from .attention import AttentionDims, CausalSelfAttention, KVCache
from .mamba1 import Mamba1Dims, Mamba1Mixer, Mamba1State
from .mamba2 import Mamba2Dims, Mamba2Mixer, Mamba2State
from .mlp import SwiGLUMLP, swiglu_hidden_size
from .norms import GatedRMSNorm, RMSNorm
from .rotary import apply_rotary, rotary_cos_sin, rotary_cos_sin_at
from .selective_scan import selective_scan_chunked, selective_scan_reference, selective_scan_step
from .ssd import ssd_chunked, ssd_reference, ssd_scan, ssd_step

__all__ = [
    "AttentionDims",
    "CausalSelfAttention",
    "GatedRMSNorm",
    "KVCache",
    "Mamba1Dims",
    "Mamba1Mixer",
    "Mamba1State",
    "Mamba2Dims",
    "Mamba2Mixer",
    "Mamba2State",
    "RMSNorm",
    "SwiGLUMLP",
    "apply_rotary",
    "rotary_cos_sin",
    "rotary_cos_sin_at",
    "selective_scan_chunked",
    "selective_scan_reference",
    "selective_scan_step",
    "ssd_chunked",
    "ssd_reference",
    "ssd_scan",
    "ssd_step",
    "swiglu_hidden_size",
]
