"""The one base of every set of options (fixed-point, training, the demos'): a frozen
dataclass whose fields are checked on creation against their annotations and the class's
``FIELD_RULES``, built from a dict whose unknown keys are refused with the closest known one.
Checks between fields go in ``check``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from .schema import Rule, check_dataclass, check_known_keys, field_names


class Options:
    WHAT: ClassVar[str] = "option"
    # The ranges of the fields (their types are the annotations) and what each means, for
    # `implicitlm options`.
    FIELD_RULES: ClassVar[dict[str, Rule]] = {}
    FIELD_HELP: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        check_dataclass(self, self.WHAT)
        self.check()

    def check(self) -> None:
        """Raise OptionError for fields that do not fit together (none by default)."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        check_known_keys(values, field_names(cls), cls.WHAT)
        return cls(**values)

    def replace(self, **changes: Any):
        check_known_keys(changes, field_names(type(self)), self.WHAT)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
