"""The model arguments of the lm-eval adapter: those lm-eval hands it, ``--model_args`` (text or
a dict) and the flags it adds itself (``--batch_size``, ``--max_batch_size``, ``--device``),
which Python would refuse, unknown or repeated, with a TypeError (here each is one line naming
it); and their values, given as Python values or, from ``--model_args``, as text."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ..core.errors import OptionError, closest_hint, quoted

# A batch size found by probing (``ImplicitLMHarness._fitting_batch_size``).
AUTO_BATCH = "auto"


def model_arguments(init: Callable, given: dict[str, Any], added: dict[str, Any] | None) -> dict[str, Any]:
    """``given`` (``--model_args``) and ``added`` (lm-eval's own flags; None: not given) as the
    keywords of ``init``: each one it takes, and each given once."""
    known = [name for name in inspect.signature(init).parameters if name != "self"]
    for name in given:
        if name not in known:
            raise OptionError(f"unknown model argument '{name}' in --model_args{closest_hint(name, known)}")
    added = {name: value for name, value in (added or {}).items() if value is not None}
    for name in given:
        if name in added:
            raise OptionError(f"model argument '{name}' given twice: {quoted(given[name])} in --model_args and "
                              f"{quoted(added[name])} by lm-eval's --{name}; give it once, as --{name}")
    return {**given, **added}


def batch_size_argument(value: Any) -> int | str:
    """A positive number, or "auto" (lm-eval's "auto:N" too: one probe per request type here)."""
    if isinstance(value, str) and value.strip().split(":")[0] == AUTO_BATCH:
        return AUTO_BATCH
    try:
        return positive_int_argument("batch_size", value)
    except OptionError:
        raise OptionError(f"batch_size must be a positive integer or auto; got {value!r}") from None


def positive_int_argument(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive integer; got {value!r}")
    return value


def boolean_argument(name: str, value: Any) -> bool:
    """A flag given as a Python bool or, from lm-eval's --model_args, as text."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false; got {value!r}")
    return value
