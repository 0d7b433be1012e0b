"""Unix-socket hygiene shared by the health and registration servers.

- the parent directory is created when missing (owner-only, 0700);
- a stale socket left by a crash is replaced, as the kubelet expects of plugins, but anything else at
  the path (a regular file, a directory, a symlink) is refused: that is an operator mistake, and
  unlinking it could destroy data or follow a link somewhere unexpected;
- the socket is bound under umask 0177, so it is 0600 from the moment it exists (no chmod window);
- on shutdown it is removed only if it is still ours (a newer instance may have replaced it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator

import grpc

#: ``sizeof(sockaddr_un.sun_path) - 1`` on Linux: longer paths cannot be bound.
MAX_SOCKET_PATH_BYTES = 107

# os.umask is process-wide: serialise our own binds so two servers starting at once can't restore
# each other's umask in the wrong order.
_UMASK_LOCK = threading.Lock()


class KubeletSocketError(RuntimeError):
    """The socket path can't be served (wrong file type, too long, bind failed); the message is one line."""


def _describe(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a socket"


def _live(path: str) -> bool:
    """Whether something accepts connections on the socket (another instance still running)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def prepare(path: str) -> bool:
    """Make ``path`` bindable: create its directory, remove a stale socket, refuse anything else.

    Returns whether a socket that still accepted connections was replaced (the caller logs it:
    the kubelet's convention is that a restarting plugin takes its socket over)."""
    if not os.path.isabs(path):
        raise KubeletSocketError(f"socket path {path!r} must be absolute (the kubelet dials absolute paths)")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise KubeletSocketError(
            f"socket path {path!r} is {len(os.fsencode(path))} bytes; unix sockets allow {MAX_SOCKET_PATH_BYTES}"
        )
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise KubeletSocketError(f"refusing to serve on {path}: it exists and is {_describe(st.st_mode)}, not a socket")
    live = _live(path)
    os.unlink(path)
    return live


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    with _UMASK_LOCK:
        old = os.umask(0o177)
        try:
            yield
        finally:
            os.umask(old)


def bind(server: grpc.Server, path: str) -> tuple[int, int]:
    """Bind ``server`` to the unix socket ``path`` (owner-only) and start it; returns the socket's
    (st_dev, st_ino), the identity :func:`remove_if_ours` checks before unlinking."""
    with _private_umask():
        try:
            server.add_insecure_port(f"unix://{path}")
            server.start()
        except RuntimeError as exc:  # grpc says only "Failed to bind"; say where
            raise KubeletSocketError(f"cannot listen on {path}: {exc}") from exc
    os.chmod(path, 0o600)  # already 0600 from the umask; explicit for filesystems that ignore it
    st = os.stat(path)
    return st.st_dev, st.st_ino


def remove_if_ours(path: str, ident: tuple[int, int] | None) -> None:
    """Unlink the socket at ``path`` if it is still the one we bound (not a successor's)."""
    if ident is None:
        return
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == ident:
            os.unlink(path)


def serve_on(server: grpc.Server, path: str, warn: Callable[[str], None]) -> tuple[int, int]:
    """:func:`prepare` then :func:`bind`; ``warn`` hears about a live socket that was taken over."""
    if prepare(path):
        warn(f"took over {path} from a process still listening on it")
    return bind(server, path)
