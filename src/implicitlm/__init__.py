"""implicitlm: implicit language models (fixed points over depth, run as RNNs).

Importing the package registers its configs and models with transformers' Auto classes.
"""

from . import models  # noqa: F401  (registers the Auto classes)

__version__ = "0.1.0"
