"""Lines to a file, gzip (level 1) on a second thread when the name ends in .gz.

Why a thread: zlib releases the GIL, so compressing one chunk overlaps formatting the next. The gzip
header's time is 0: the same seed writes the same bytes.
"""

from __future__ import annotations

import gzip
import queue
import threading
from pathlib import Path
from types import TracebackType
from typing import IO


class LineWriter:
    """Lines to a file; gzip (level 1) on a second thread when the name ends in .gz."""

    CHUNK = 4 << 20

    def __init__(self, path: Path) -> None:
        self._raw: IO[bytes] = path.open("wb")
        self._out: IO[bytes] | gzip.GzipFile = self._raw
        if path.name.endswith(".gz"):
            self._out = gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=self._raw, mtime=0)
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._buf: list[str] = []
        self._size = 0
        self._thread = threading.Thread(target=self._drain, name="scenario-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                return
            if self._error is None:
                try:
                    self._out.write(data)
                except BaseException as exc:  # reported by the writing thread at its next flush
                    self._error = exc

    def write(self, line: str) -> None:
        self._buf.append(line)
        self._size += len(line)
        if self._size >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._error is not None:
            raise self._error
        if self._buf:
            self._queue.put(("\n".join(self._buf) + "\n").encode())
            self._buf, self._size = [], 0

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if kind is None:
                self._flush()
        finally:
            self._queue.put(None)
            self._thread.join()
            if self._out is not self._raw:
                self._out.close()
            self._raw.close()
        if kind is None and self._error is not None:
            raise self._error
