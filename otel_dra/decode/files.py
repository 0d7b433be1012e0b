"""Replay's input files: their lines, gzip or not, and the one error a file that can't be read raises.

A recording is gigabytes of text once inflated (a 2-hour, 500-device fleet: 8 GB): it is inflated with
zlib-ng (zlib's format, ~4x faster) in pieces of a megabyte and cut into lines with one C-level split per
piece, not read through ``gzip.GzipFile`` (a Python-level call and a second CRC pass per 8 kB): on such a
file that was a third of a replay's time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Final, cast

from zlib_ng import zlib_ng

from otel_dra.decode.text import one_line

_GZIP_MAGIC: Final = b"\x1f\x8b"
#: Bytes read from a file at once, and the most inflated bytes made at once (what a piece holds in memory).
READ_SIZE: Final = 1 << 16
PIECE_SIZE: Final = 1 << 20
#: zlib-ng's error class (its stub declares an instance).
_InflateError: Final = cast(type[Exception], zlib_ng.error)


class InputFileError(OSError):
    """An input file that can't be opened or read (missing, unreadable, corrupt gzip).

    Its message is one line naming the file; the CLI turns it into exit code 2.
    """


def _inflated(handle: IO[bytes]) -> Iterator[bytes]:
    """A gzip file's content in pieces of at most PIECE_SIZE, as ``gzip`` reads it: members one after
    another, zero bytes padding between or after them. The gzip checks (header, CRC-32, length) are
    zlib's; a stream cut short raises ``EOFError``, damage ``zlib_ng.error``."""
    inflater: zlib_ng._Decompress | None = None  # None: between members
    data = b""
    while True:
        if not data:
            data = handle.read(READ_SIZE)
            if not data:
                if inflater is None:
                    return
                while True:  # what the last input still holds (a piece cut at PIECE_SIZE)
                    piece = inflater.decompress(b"", PIECE_SIZE)
                    if not piece:
                        break
                    yield piece
                if not inflater.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return
        if inflater is None:
            data = data.lstrip(b"\0")
            if not data:
                continue
            inflater = zlib_ng.decompressobj(16 + zlib_ng.MAX_WBITS)
        piece = inflater.decompress(data, PIECE_SIZE)
        if piece:
            yield piece
        if inflater.eof:
            data, inflater = inflater.unused_data, None
        else:
            data = inflater.unconsumed_tail


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
                pieces = _inflated(handle) if handle.peek(2)[:2] == _GZIP_MAGIC else _plain(handle)
                for lineno, raw in enumerate(_lines(pieces), 1):
                    line = raw.rstrip(b"\r\n")
                    del raw  # (not held while the line is decoded: a line of a fleet's node is 300 kB)
                    if line.strip():
                        yield path, lineno, line
                    del line  # (nor while the next is read)
            except (OSError, EOFError, _InflateError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise InputFileError(one_line(f"{path}: cannot read after line {lineno}: {reason}")) from exc
