"""One log line per event: timestamp, level, component, message; an exception is
summarised on the same line (type and text), never as a traceback."""

from __future__ import annotations

import logging
import sys
import time


class OneLineFormatter(logging.Formatter):
    """ISO-8601 UTC timestamps, ``key=value`` framing, exceptions folded into the line."""

    converter = staticmethod(time.gmtime)

    def __init__(self) -> None:
        super().__init__("%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s", "%Y-%m-%dT%H:%M:%SZ")

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        line = super().format(record)
        if exc and exc[1] is not None:
            line += f" error={type(exc[1]).__name__}: {exc[1]}"
        return line.replace("\n", " | ")


def setup_logging(level: str = "info") -> None:
    """Route every logger (ours, the SDK's, grpc's) through the one-line formatter on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
