"""The validators a policy's schema is made of, and the one error a user sees.

Each validator takes a YAML node, the key's dotted path and a location function, and returns the
Python value, or raises :class:`PolicyError` at the node's position: so every message names the
file, line, column and key, and what would be valid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def show(value: object, limit: int = 60) -> str:
    """A value as it appears in an error: its repr, shortened so a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


class PolicyError(ValueError):
    """A policy file a user must fix; ``str()`` is one line: ``FILE:LINE:COL: KEY: problem``."""


Where = Callable[[yaml.Node, str], PolicyError]
Validator = Callable[[yaml.Node, str, Where], Any]


def where_in(source: str) -> Where:
    """The location function for one file: ``SOURCE:LINE:COL: message``."""

    def at(node: yaml.Node, message: str) -> PolicyError:
        mark = node.start_mark
        return PolicyError(f"{source}:{mark.line + 1}:{mark.column + 1}: {message}")

    return at


def scalar(node: yaml.Node, key: str, where: Where) -> Any:
    """The single value a node holds (a list or mapping is an error)."""
    if not isinstance(node, yaml.ScalarNode):
        got = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        raise where(node, f"{key}: expected a single value, got a {got}")
    return constructed(node, key, where)


def constructed(node: yaml.Node, key: str, where: Where) -> Any:
    """The Python value of a node, as ``safe_load`` of its text gives it: the safe loader's own construction of the
    node as composed (its tags resolved then), without emitting and parsing its text again (a policy's few hundred
    scalars took most of its load that way). A tag the safe loader does not construct (``!!python/object``,
    ``!foo``) is the user's mistake, named at its node."""
    try:
        return SafeConstructor().construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise where(node, f"{key}: {problem}; write a plain value") from None


def number(lo: float | None = None, hi: float | None = None, integer: bool = False) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> float:
        value = scalar(node, key, where)
        kind = "a whole number" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
            raise where(node, f"{key}: expected {kind}, got {show(value)}")
        if value != value or (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else f"at least {lo:g}"
            raise where(node, f"{key}: {show(value)} is out of range; use {kind} {bounds}")
        return value

    return check


def parse_duration(text: str) -> float | None:
    """``30s``, ``5m``, ``1h``, ``1d``, ``250ms`` or a bare number of seconds, in seconds; None when it is none."""
    match = _DURATION.match(text)
    return None if match is None else float(match[1]) * _UNITS[match[2]]


def duration(node: yaml.Node, key: str, where: Where) -> float:
    """``30s``, ``5m``, ``1h``, ``1d`` or seconds; returned in seconds."""
    value = scalar(node, key, where)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        raise where(node, f"{key}: {show(value)} is not a duration; write e.g. 30s, 5m, 1h or a number of seconds")
    return seconds


def positive_duration(node: yaml.Node, key: str, where: Where) -> float:
    """A :func:`duration` longer than zero (a time constant, something divided by)."""
    value = duration(node, key, where)
    if value <= 0:
        raise where(node, f"{key}: must be longer than 0s; write e.g. 30m or 1h")
    return value


def one_of(choices: tuple[str, ...]) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> str:
        value = scalar(node, key, where)
        if value not in choices:
            raise where(node, f"{key}: {show(value)} is not one of: {', '.join(choices)}")
        return str(value)

    return check


def string(node: yaml.Node, key: str, where: Where) -> str:
    value = scalar(node, key, where)
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise where(node, f"{key}: expected a string, got {show(value)}")
    return str(value)


def boolean(node: yaml.Node, key: str, where: Where) -> bool:
    value = scalar(node, key, where)
    if not isinstance(value, bool):
        raise where(node, f"{key}: expected true or false, got {show(value)}")
    return value


def list_of(item: Validator, min_len: int = 0) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> list[Any]:
        if not isinstance(node, yaml.SequenceNode):
            raise where(node, f"{key}: expected a list, e.g. [a, b]")
        if len(node.value) < min_len:
            raise where(node, f"{key}: needs at least {min_len} entr{'y' if min_len == 1 else 'ies'}")
        return [item(child, f"{key}[{i}]", where) for i, child in enumerate(node.value)]

    return check


def map_of(key_check: Validator, value_check: Validator) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise where(node, f"{key}: expected a mapping, e.g. {{a: 1}}")
        return {
            key_check(k, f"{key} key", where): value_check(v, f"{key}.{scalar(k, key, where)}", where)
            for k, v in node.value
        }

    return check


def struct(fields: Mapping[str, Validator]) -> Validator:
    """A mapping with exactly these keys allowed (any subset: the rest comes from the default)."""

    def check(node: yaml.Node, key: str, where: Where) -> dict[str, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise where(node, f"{key or 'policy'}: expected a mapping")
        out: dict[str, Any] = {}
        for k, v in node.value:
            name = scalar(k, key, where)
            path = f"{key}.{name}" if key else str(name)
            if name not in fields:
                raise where(k, f"{path}: unknown key; allowed here: {', '.join(fields)}")
            if name in out:
                raise where(k, f"{path}: given twice")
            out[str(name)] = fields[str(name)](v, path, where)
        return out

    return check


FRACTION = number(0.0, 1.0)
POSITIVE = number(0.0)
COUNT = number(1, None, integer=True)
