"""Replay's input files: their lines, gzip or not, and the one error a file that can't be read raises."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from otel_dra.decode.text import one_line


class InputFileError(OSError):
    """An input file that can't be opened or read (missing, unreadable, corrupt gzip).

    Its message is one line naming the file; the CLI turns it into exit code 2.
    """


def read_lines(paths: Iterable[Path]) -> Iterator[tuple[Path, int, bytes]]:
    """Each non-empty line of each file as (path, 1-based line number, raw bytes without the
    newline). Gzip is detected by its magic bytes, whatever the file is called.

    Raises :class:`InputFileError` (an ``OSError``) naming the file when it can't be opened
    or its gzip stream is corrupt or cut short; lines before the damage are yielded first.
    """
    for path in paths:
        path = Path(path)
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise InputFileError(one_line(f"{path}: cannot open: {exc.strerror or exc}")) from exc
        lineno = 0
        with handle:
            try:
                stream = gzip.GzipFile(fileobj=handle) if handle.peek(2)[:2] == b"\x1f\x8b" else handle
                for lineno, raw in enumerate(stream, 1):
                    line = raw.rstrip(b"\r\n")
                    del raw  # (not held while the line is decoded: a line of a fleet's node is 300 kB)
                    if line.strip():
                        yield path, lineno, line
                    del line  # (nor while the next is read)
            except (OSError, EOFError, zlib.error) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise InputFileError(one_line(f"{path}: cannot read after line {lineno}: {reason}")) from exc
