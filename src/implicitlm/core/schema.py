"""Validated fields: the type and the range of every option a user or a file can set.

Options arrive as JSON (presets, config files, ``KEY=VALUE`` on the command line, a
checkpoint's config.json), so a value may be of any JSON type. A config declares each
field's type by its annotation and its range or choices in a class-level ``FIELD_RULES``
mapping; ``check_fields`` checks both and raises an ``OptionError`` of one line naming
the field, e.g. ``training option 'lr' must be a number > 0, got 'abc'``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .errors import ImplicitLMError, OptionError, closest_hint, quoted


@dataclass(frozen=True)
class Rule:
    """A condition on a value of the right type.

    ``expected`` reads after the type's description ("an integer" ">= 1"), or instead of
    it when ``replaces_type`` ("one of 'rel', 'abs'").
    """

    expected: str
    holds: Callable[[Any], bool]
    replaces_type: bool = False


def at_least(minimum: int) -> Rule:
    return Rule(f">= {minimum}", lambda value: value >= minimum)


def one_of(*choices: Any) -> Rule:
    return Rule(f"one of {', '.join(map(repr, choices))}", lambda value: value in choices, replaces_type=True)


def between(low: float, high: float) -> Rule:
    return Rule(f"in [{low}, {high}]", lambda value: low <= value <= high)


POSITIVE = Rule("> 0", lambda value: value > 0)
NON_NEGATIVE = at_least(0)
UNIT_INTERVAL = between(0, 1)
# Not negative, and small enough for torch.manual_seed.
SEED = between(0, 2**63 - 1)

# Singular and plural descriptions of the scalar types, as a JSON user would write them.
_SCALARS = {
    bool: ("true or false", "booleans"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}


def check_fields(
    values: Mapping[str, Any], annotations: Mapping[str, Any], rules: Mapping[str, Rule], what: str
) -> None:
    """Check each value that has an annotation (its type), and its rule if it has one."""
    for name, value in values.items():
        if name in annotations:
            check_field(what, name, value, annotations[name], rules.get(name))


def check_field(what: str, name: str, value: Any, annotation: Any, rule: Rule | None = None) -> None:
    # The rule applies to a value of the right type; None, where allowed, has no range.
    if conforms(value, annotation) and (rule is None or value is None or rule.holds(value)):
        return
    raise option_error(what, name, expectation(annotation, rule), value)


def option_error(what: str, name: str, expected: str, value: Any) -> OptionError:
    return OptionError(f"{what} '{name}' must be {expected}, got {quoted(value)}")


def check_dataclass(instance: Any, what: str) -> None:
    """Check every field of a dataclass instance (frozen or not) against its annotation and
    the class's ``FIELD_RULES``; a list given for a tuple field (JSON has no tuples) becomes one."""
    cls = type(instance)
    hints = typing.get_type_hints(cls)
    rules = getattr(cls, "FIELD_RULES", {})
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        check_field(what, field.name, value, hints[field.name], rules.get(field.name))
        if typing.get_origin(hints[field.name]) is tuple and isinstance(value, list):
            object.__setattr__(instance, field.name, tuple(value))


def conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` has the annotated type; bools are not integers, integers are numbers."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, arg) for arg in args)
    if annotation in (bool, str):
        return isinstance(value, annotation)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return isinstance(value, int) or math.isfinite(value)
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if origin is tuple and args[-1] is not Ellipsis:  # fixed length: tuple[float, float]
            return len(value) == len(args) and all(map(conforms, value, args))
        return all(conforms(item, args[0]) for item in value)
    if origin is dict:
        key_type, value_type = args
        if not isinstance(value, dict):
            return False
        return all(conforms(key, key_type) and conforms(item, value_type) for key, item in value.items())
    # A field's annotation the checks do not cover is a fault of the package, not of the
    # input: not an OptionError, so the command line shows it as a traceback.
    raise ImplicitLMError(f"check_field has no check for the annotation {annotation!r}")


def expectation(annotation: Any, rule: Rule | None = None) -> str:
    """What a field expects, in words: "a number in [0, 1] or null"."""
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(None) in args
    if optional:
        annotation = typing.Union[tuple(arg for arg in args if arg is not type(None))]
    text = describe(annotation)
    if rule is not None:
        text = rule.expected if rule.replaces_type else f"{text} {rule.expected}"
    return f"{text} or null" if optional else text


def describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation][0]
    if origin in (types.UnionType, typing.Union):
        return " or ".join(describe(arg) for arg in args)
    if origin is tuple and args[-1] is not Ellipsis:
        return f"a list of {len(args)} {_SCALARS[args[0]][1]}"
    if origin in (tuple, list):
        return f"a list of {'dicts' if typing.get_origin(args[0]) is dict else _SCALARS[args[0]][1]}"
    if origin is dict:
        return "a dict"
    return "any value"


def field_names(schema: type) -> list[str]:
    return [field.name for field in dataclasses.fields(schema)]


def check_known_keys(values: Mapping[str, Any], known: Sequence[str], what: str) -> None:
    """Raise OptionError for the first key of ``values`` not in ``known``, naming the closest one."""
    for key in values:
        if key not in known:
            raise OptionError(f"unknown {what} {quoted(key)}{closest_hint(key, known)}")


def dataclass_defaults(schema: type) -> dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(schema)}


def option_help(title: str, defaults: Mapping[str, Any], meanings: Mapping[str, str]) -> str:
    """A --help section: one line per option with its default and what it means. Defaults
    are compact JSON, as a KEY=VALUE option takes them."""
    values = {name: json.dumps(default, separators=(",", ":")) for name, default in defaults.items()}
    name_width, value_width = max(map(len, values)), max(map(len, values.values()))
    lines = [f"  {name:<{name_width}}  {value:<{value_width}}  {meanings[name]}" for name, value in values.items()]
    return "\n".join([title, *lines])
