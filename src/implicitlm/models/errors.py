"""The error of a model that cannot be loaded or imported (below the loaders and the family folders, which raise it)."""

from __future__ import annotations

from ..core.errors import ImplicitLMError


class ModelLoadError(ImplicitLMError, ValueError):
    """A directory that does not hold a model this package can load."""
