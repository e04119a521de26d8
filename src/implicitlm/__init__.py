"""implicitlm: implicit language models (fixed points over depth, run as RNNs)."""

__version__ = "0.1.0"
