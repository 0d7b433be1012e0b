"""Text for messages: whatever the input holds, a message stays one short line; and each encoding's
dialect (how it names a point's fields and prints counts), so the checks are written once."""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any, Final


def name(text: str, limit: int = 60) -> str:
    """A name from the input (node, device, key) as it goes into a one-line message."""
    return text if len(text) <= limit and text.isprintable() else short(text, limit)


def one_line(message: str) -> str:
    """Whatever the input held, an error message stays on one line."""
    return message if message.isprintable() else message.encode("unicode_escape").decode("ascii")


def short(value: Any, limit: int = 40) -> str:
    """A JSON value for a one-line message, cut short."""
    if type(value) is list:
        return "a list"
    if type(value) is dict:
        return "an object"
    try:
        text = repr(value[: limit + 2]) if type(value) is str else json.dumps(value)
    except ValueError:  # an int too long to print
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Dialect:
    """How one encoding's messages name the point's fields and print counts (kept as they always were)."""

    time: str
    double: str
    int: str
    grouped: bool  # counts with thousands separators

    def count(self, n: builtins.int) -> str:  # `int` in this class body is the field
        return f"{n:,}" if self.grouped else str(n)


JSON_DIALECT: Final = Dialect("timeUnixNano", "asDouble", "asInt", grouped=False)
PROTO_DIALECT: Final = Dialect("time_unix_nano", "as_double", "as_int", grouped=True)
