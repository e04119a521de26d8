"""implicitlm: implicit language models (fixed points over depth, run as RNNs).

Importing ``implicitlm.models`` registers the configs and models with transformers' Auto
classes. The package itself imports neither torch nor transformers, so that the command line
answers ``--help`` at once.
"""

__version__ = "0.1.0"
