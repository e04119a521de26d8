"""What every other part builds on: the exception hierarchy (one base class,
``ImplicitLMError``), atomic file writes and JSON reading, option validation, memory checks,
run folders and the weights' checksum. It imports nothing else of implicitlm."""

from .errors import DataError, ImplicitLMError, NumericalFault, OptionError

__all__ = ["DataError", "ImplicitLMError", "NumericalFault", "OptionError"]
