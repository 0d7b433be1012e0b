"""Raw-socket helpers for the tests that talk HTTP below any client library (attacks, the server's bounds)."""

from __future__ import annotations

import socket
import time


def exchange(port: int, data: bytes, wait_s: float = 3.0) -> tuple[bytes, float]:
    """Send ``data`` on a fresh loopback connection; what came back until the server closed it (or
    ``wait_s`` passed), and how long that took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out, time.monotonic() - started
