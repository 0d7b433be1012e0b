"""The gRPC server's workers: a bounded wait, an answer at once past it, and a deadline on reading a request.

grpcio runs each call's handler on the executor it was given and, past ``maximum_concurrent_rpcs``,
answers ``RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!"`` from its core, with no way to add a
retry delay; the OTLP specification says an exporter must not retry ``RESOURCE_EXHAUSTED`` without
``RetryInfo``, so a compliant client drops that data. So the limit that matters is here:
:class:`ShedPool` lets at most ``workers + queue`` calls run or wait; a call past that runs on a
small pool of its own, where :func:`shedding` is true and the handler answers "retry later"
(``UNAVAILABLE`` with a ``RetryInfo`` delay) before reading the request.

That is cheap because the handler takes its request as a stream (``stream_unary``, the same bytes on
the wire as unary): grpcio reads a message only when the handler asks for it, so a call waiting for
a worker holds no more than gRPC's flow-control window, and a refused one is never read.

Reading is bounded too: :class:`ReadDeadlines` cancels a call whose request has not arrived within
the body timeout of its handler asking for it (a trickled body would hold a worker).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

#: Threads that answer calls past the bound; they only refuse, which takes microseconds.
SHED_THREADS: Final = 2
#: How often :class:`ReadDeadlines` looks for late requests.
CHECK_EVERY_S: Final = 0.25

_local = threading.local()


def shedding() -> bool:
    """Whether the calling handler runs past the bound and is to answer "retry later" at once."""
    return bool(getattr(_local, "shed", False))


def _as_shed(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    _local.shed = True
    try:
        return fn(*args, **kwargs)
    finally:
        _local.shed = False


class ShedPool(ThreadPoolExecutor):
    """``workers`` threads, at most ``queue`` calls waiting for them; the rest are shed (:func:`shedding`)."""

    def __init__(self, workers: int, queue: int, name: str = "otlp-grpc") -> None:
        super().__init__(workers, thread_name_prefix=name)
        self.bound = workers + queue
        self._taken = 0
        self._lock = threading.Lock()
        self._shed = ThreadPoolExecutor(SHED_THREADS, thread_name_prefix=f"{name}-shed")

    @property
    def waiting(self) -> int:
        """Calls running or waiting for a worker now."""
        return self._taken

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            full = self._taken >= self.bound
            if not full:
                self._taken += 1
        if full:
            return self._shed.submit(_as_shed, fn, args, kwargs)
        return super().submit(self._run, fn, args, kwargs)

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._taken -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._shed.shutdown(wait, cancel_futures=cancel_futures)
        super().shutdown(wait, cancel_futures=cancel_futures)


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


class ReadDeadlines:
    """Cancels each watched call that is still watched ``timeout_s`` after :meth:`watch` (gRPC's
    ``ServicerContext.cancel``: the handler's read fails, the client gets ``CANCELLED``). One thread
    looks every :data:`CHECK_EVERY_S` while any call is watched, and sleeps while none is (an idle
    fleet's receiver wakes for nothing); watching and letting go are a dict insert and delete."""

    def __init__(self, timeout_s: float, on_late: Callable[[], None] | None = None) -> None:
        self.timeout_s = timeout_s
        self._on_late = on_late
        self._watched: dict[int, tuple[float, Cancellable]] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otlp-grpc-read-deadlines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(1.0)

    def watch(self, call: Cancellable) -> int:
        token = next(self._ids)
        entry = (time.monotonic() + self.timeout_s, call)
        with self._cond:
            self._watched[token] = entry
            if len(self._watched) == 1:
                self._cond.notify()
        return token

    def done(self, token: int) -> None:
        self._watched.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._watched or self._stopped)  # (asleep while none is watched)
                if not self._stopped:
                    self._cond.wait(CHECK_EVERY_S)  # (then a look every CHECK_EVERY_S; a stop wakes it)
                if self._stopped:
                    return
                now = time.monotonic()
                late = [t for t, (deadline, _) in list(self._watched.items()) if deadline <= now]
            for token in late:
                entry = self._watched.pop(token, None)
                if entry is not None:
                    entry[1].cancel()
                    if self._on_late is not None:
                        self._on_late()
