"""Gzip streams inflated by zlib-ng (zlib's format and checks, ~4x faster), in bounded pieces: one member walk
for the two readers of gzip, replay's files (``decode.files``) and OTLP/HTTP bodies (``serve.http``), which
differ only in where the bytes come from and in the bounds they hold the inflation to; and a body that is one whole
member (what an exporter sends) inflated in one call (:func:`one_member`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, cast

from zlib_ng import zlib_ng

#: Compressed bytes a reader hands over at a time: a member's end copies what is left of them (zlib's
#: ``unused_data``), so a stream of many small members stays linear.
READ_SIZE: Final = 1 << 16
#: The most inflated bytes made at once (what one piece holds in memory).
PIECE_SIZE: Final = 1 << 20
#: zlib-ng's error class (its stub declares an instance): damaged gzip.
InflateError: Final = cast(type[Exception], zlib_ng.error)
#: zlib's window bits for a gzip member (its header and trailer, not a zlib stream's).
_GZIP_WBITS: Final = 16 + zlib_ng.MAX_WBITS


def inflate(
    read: Callable[[], bytes | memoryview],
    piece_size: int = PIECE_SIZE,
    member: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The content of the gzip stream ``read`` hands over (each call up to :data:`READ_SIZE` bytes, empty at
    its end) in pieces of at most ``piece_size``, as ``gzip`` reads it: members one after another, zero bytes
    padding between or after them. ``member(n)`` is called as the n-th member starts (a bound on members or
    CPU raises there: empty members yield nothing). The gzip checks (header, CRC-32, length) are zlib's; a
    stream cut short raises ``EOFError``, damage :data:`InflateError`."""
    inflater: zlib_ng._Decompress | None = None  # None: between members
    members = 0
    data: bytes | memoryview = b""
    while True:
        if not data:
            data = read()
            if not data:
                if inflater is None:
                    return
                while piece := inflater.decompress(b"", piece_size):  # what the last input still holds
                    yield piece
                if not inflater.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return
        if inflater is None:
            if data[:1] == b"\0":
                data = bytes(data).lstrip(b"\0")
                if not data:
                    continue
            members += 1
            if member is not None:
                member(members)
            inflater = zlib_ng.decompressobj(_GZIP_WBITS)
        piece = inflater.decompress(data, piece_size)
        if piece:
            yield piece
        if inflater.eof:
            data, inflater = inflater.unused_data, None
        else:
            data = inflater.unconsumed_tail


def reader(body: bytes) -> Callable[[], memoryview]:
    """``read`` for :func:`inflate` over bytes already held: :data:`READ_SIZE` at a time, not copied."""
    view = memoryview(body)
    pos = 0

    def read() -> memoryview:
        nonlocal pos
        piece = view[pos : pos + READ_SIZE]
        pos += len(piece)
        return piece

    return read


#: The smallest gzip member: its header (10 bytes) and its trailer (8: the CRC-32 and the content's length mod
#: 2**32, RFC 1952 section 2.3.1).
_SMALLEST_MEMBER: Final = 18


def one_member(body: bytes, limit: int) -> bytes | None:
    """The content of ``body`` when it is one whole gzip member of at most ``limit`` bytes, inflated in one
    call into a buffer of the size its trailer states (what an exporter sends: no pieces to join, and a
    collector's batch of 3 MB inflated in two thirds of the time); None when it is anything else (several
    members, padding, a size that is not what the trailer says, damage): :func:`inflate` decides those. At most
    ``limit`` + 1 bytes are made whatever the trailer claims (one call: inflating is linear in what it makes)."""
    if len(body) < _SMALLEST_MEMBER or body[:2] != b"\x1f\x8b":
        return None
    size = int.from_bytes(body[-4:], "little")
    if size > limit:
        return None
    inflater = zlib_ng.decompressobj(_GZIP_WBITS)
    try:
        content = inflater.decompress(body, size + 1)
    except InflateError:
        return None
    if not inflater.eof or inflater.unused_data or inflater.unconsumed_tail or len(content) != size:
        return None
    return content
