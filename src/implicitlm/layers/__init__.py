"""Layers with a parallel form and a one-token step form; they know no model."""

from .mamba2 import Mamba2Dims, Mamba2Mixer, Mamba2State
from .norms import GatedRMSNorm, RMSNorm
from .ssd import ssd_chunked, ssd_reference, ssd_step

__all__ = [
    "GatedRMSNorm",
    "Mamba2Dims",
    "Mamba2Mixer",
    "Mamba2State",
    "RMSNorm",
    "ssd_chunked",
    "ssd_reference",
    "ssd_step",
]
