"""Replay's input files: their lines, gzip or not, and the one error a file that can't be read raises.

A recording is gigabytes of text once inflated (a 2-hour, 500-device fleet: 8 GB): it is inflated with
zlib-ng (zlib's format, ~4x faster) in pieces of a megabyte and cut into lines with one C-level split per
piece, not read through ``gzip.GzipFile`` (a Python-level call and a second CRC pass per 8 kB): on such a
file that was a third of a replay's time."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Final

from otel_dra.decode.text import one_line
from otel_dra.inflate import PIECE_SIZE, READ_SIZE, InflateError, inflate

_GZIP_MAGIC: Final = b"\x1f\x8b"


class InputFileError(OSError):
    """An input file that can't be opened or read (missing, unreadable, corrupt gzip).

    Its message is one line naming the file; the CLI turns it into exit code 2.
    """


def _plain(handle: IO[bytes]) -> Iterator[bytes]:
    """A plain file's content in pieces."""
    while piece := handle.read(PIECE_SIZE):
        yield piece


def _lines(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of the text the pieces make, each without its ``\\n`` (the last one too when it has none).
    Cut at each ``find`` of a newline (memchr: a piece holds a few lines of a fleet's, so few calls), not by
    ``split``, which reads the piece a byte at a time."""
    held: list[bytes] = []  # the start of a line that runs on into the next piece (a list: linear if long)
    for piece in pieces:
        find = piece.find
        start = 0
        end = find(b"\n")
        while end >= 0:
            if held:
                held.append(piece[start:end])
                yield b"".join(held)
                held = []
            else:
                yield piece[start:end]
            start = end + 1
            end = find(b"\n", start)
        if start < len(piece):
            held.append(piece[start:] if start else piece)
    if held:
        yield b"".join(held)


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
                gzipped = handle.peek(2)[:2] == _GZIP_MAGIC
                pieces = inflate(functools.partial(handle.read, READ_SIZE)) if gzipped else _plain(handle)
                for lineno, raw in enumerate(_lines(pieces), 1):
                    line = raw.rstrip(b"\r\n")
                    del raw  # (not held while the line is decoded: a line of a fleet's node is 300 kB)
                    if line.strip():
                        yield path, lineno, line
                    del line  # (nor while the next is read)
            except (OSError, EOFError, InflateError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise InputFileError(one_line(f"{path}: cannot read after line {lineno}: {reason}")) from exc
