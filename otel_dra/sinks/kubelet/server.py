"""The kubelet's device-health stream (KEP-4680): ``DRAResourceHealth.NodeWatchResources`` on a unix socket.

Each stream gets the complete device list at once, again on every verdict change, and at least every
``min(health_check_timeout_s / 3, 10 s)`` when nothing changes: the kubelet marks a device Unknown when
it hears nothing about it within its timeout, and whenever a stream ends. The timeout is the kubelet's,
not ours: a 1.34 kubelet uses a fixed 30 s and ignores ``health_check_timeout_seconds``; from 1.35 it
uses that field per device (0 or unset: 30 s). Capping the resend interval at a third of 30 s keeps a
1.34 kubelet satisfied whatever ``--kubelet-health-timeout`` says. Both proto packages are served,
``v1alpha1`` (what kubelets up to 1.36 call) and ``v1`` (kubelet head); their messages are identical
on the wire, so one encoded list serves both.

Threads: grpc's sync server runs each stream on a worker thread for the stream's lifetime, so the pool
(``max_workers``, default 32) bounds the concurrent streams; a stream beyond it is refused at once with
RESOURCE_EXHAUSTED (the kubelet retries every 5 s) instead of queueing forever. The kubelet holds one
stream per registered plugin, so a handful is the norm. One follower thread waits on the
:class:`~otel_dra.state.board.VerdictBoard` and wakes the streams; a stream whose client goes away is
woken by grpc's termination callback and frees its worker at once, and :meth:`KubeletHealthServer.stop`
ends every stream immediately.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.classifier.views import combine
from otel_dra.sinks.config import KUBELET_DEFAULT_TIMEOUT_S
from otel_dra.sinks.kubelet import _socket
from otel_dra.sinks.kubelet.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import DEFAULT_COMBINE

log = logging.getLogger(__name__)

#: gRPC service names served, "<proto package>.<service>": also what registration advertises.
HEALTH_SERVICES: tuple[str, ...] = ("v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth")
METHOD = "NodeWatchResources"
_REQUEST_TYPES = {
    "v1alpha1.DRAResourceHealth": dra_health_v1alpha1_pb2.NodeWatchResourcesRequest,
    "v1.DRAResourceHealth": dra_health_v1_pb2.NodeWatchResourcesRequest,
}

#: The health proto's limit on ``DeviceHealth.message``.
MAX_MESSAGE = 1024
ELLIPSIS = "..."

#: The longest quiet gap between two full lists: a third of that 30 s, so a 1.34 kubelet, which
#: ignores health_check_timeout_seconds, never times a device out, however long the configured timeout.
MAX_RESEND_S = KUBELET_DEFAULT_TIMEOUT_S / 3.0

#: How often the follower thread re-checks for shutdown while the board is quiet.
_FOLLOW_POLL_S = 0.25

_pb = dra_health_v1alpha1_pb2  # v1 is byte-for-byte the same on the wire
_HEALTH = {"Healthy": _pb.HEALTHY, "Unhealthy": _pb.UNHEALTHY, "Unknown": _pb.UNKNOWN}


#: Observable gauges of the stream (project extensions, registered in semconv/registry.yaml).
UNIDENTIFIED_DEVICES = cv.DRA_KUBELET_DEVICES_UNIDENTIFIED
WATCHERS = cv.DRA_KUBELET_WATCHERS


# -- the message ---------------------------------------------------------------------------
def truncate_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to at most ``limit`` characters *and* UTF-8 bytes, on a character boundary, ending
    in ``...`` when cut (upstream's own truncation marker). Counting bytes as well keeps a message with
    non-ASCII text inside the limit however the kubelet counts (Go's ``len`` counts bytes)."""
    data = text.encode("utf-8", "replace")  # a lone surrogate would fail to serialise: '?' instead
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - len(ELLIPSIS)].decode("utf-8", "ignore") + ELLIPSIS


def device_message(verdict: Verdict) -> str:
    """What an admin reads in ``allocatedResourcesStatus``: health, state, reasons, remediation, evidence."""
    head = (
        f"{verdict.health}: state={verdict.state or 'unknown'} "
        f"reasons={','.join(verdict.reasons) or 'none'} remediation={verdict.remediation}"
    )
    return truncate_message(f"{head}; {verdict.message}" if verdict.message else head)


def identified(verdict: Verdict) -> bool:
    """Whether the kubelet can name the device: both ``dra.pool.name`` and ``dra.device.name`` known."""
    return bool(verdict.pool) and bool(verdict.device)


def _report_time(verdict: Verdict, now_s: int) -> int:
    """``last_updated_time``: the device's newest sample (unix seconds), else now."""
    return verdict.last_reported_time // 1_000_000_000 if verdict.last_reported_time > 0 else now_s


def build_response(
    verdicts: Iterable[Verdict], timeout_s: int, now_s: int, combine_mode: str = DEFAULT_COMBINE
) -> tuple[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse, list[Verdict]]:
    """The complete device list, sorted by (pool, device), and the verdicts left out (no identity).

    Verdicts naming the same (pool, device) (several nodes' views of one device) are reported
    once, combined by the policy's ``shared_devices.combine`` mode, so the kubelet's
    last-one-wins never depends on iteration order."""
    views: dict[tuple[str, str], list[Verdict]] = {}
    left_out: list[Verdict] = []
    for verdict in verdicts:
        if not identified(verdict):
            left_out.append(verdict)
            continue
        views.setdefault((verdict.pool or "", verdict.device or ""), []).append(verdict)
    response = _pb.NodeWatchResourcesResponse()
    add = response.devices.add  # filled in place: no per-device copy into the repeated field
    for key in sorted(views):
        verdict = combine(views[key], combine_mode)
        health = _HEALTH.get(verdict.health, _pb.UNKNOWN)
        entry = add(
            health=health,
            last_updated_time=_report_time(verdict, now_s),
            health_check_timeout_seconds=timeout_s,
            message=device_message(verdict),
        )
        entry.device.pool_name, entry.device.device_name = key
    return response, left_out


# -- the server ----------------------------------------------------------------------------
@dataclass(eq=False)
class _Watcher:
    service: str
    ended: bool = False


class KubeletHealthServer:
    """Serves ``DRAResourceHealth`` (v1alpha1 and v1) from a :class:`VerdictBoard` on a unix socket."""

    def __init__(
        self,
        socket_path: str,
        board: VerdictBoard,
        health_check_timeout_s: float = KUBELET_DEFAULT_TIMEOUT_S,
        meter: Meter | None = None,
        *,
        max_workers: int = 32,
        liveness: Callable[[], bool] | None = None,
        combine_mode: str = DEFAULT_COMBINE,
    ) -> None:
        """``liveness``, when given, says whether the verdicts are still being refreshed (e.g. the agent's
        store has a fresh sample); while it says no, the periodic resends stop, so the kubelet's own
        timeout turns the devices Unknown instead of being told stale verdicts forever. Changes are
        always sent."""
        if not health_check_timeout_s > 0:
            raise ValueError(f"health_check_timeout_s must be > 0, got {health_check_timeout_s}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.socket_path = socket_path
        self.board = board
        self.health_check_timeout_s = float(health_check_timeout_s)
        # The proto field is whole seconds; round up so a sub-second setting is not read as "default".
        self.timeout_field_s = max(1, math.ceil(self.health_check_timeout_s))
        # A third of our timeout, and never more than a third of a 1.34 kubelet's fixed 30 s.
        self.resend_s = min(self.health_check_timeout_s / 3.0, MAX_RESEND_S)
        self.max_workers = max_workers
        self.combine_mode = combine_mode  # how several nodes' views of one device combine (policy)
        self._liveness = liveness
        self._live_logged = True
        self._cond = threading.Condition()
        self._version = board.version  # the board version the streams have been told about
        self._stopping = False
        self._watchers: set[_Watcher] = set()
        self._server: grpc.Server | None = None
        self._follower: threading.Thread | None = None
        self._socket_id: tuple[int, int] | None = None
        self._encode_lock = threading.Lock()
        self._encoded_key: tuple[int, int] | None = None
        self._encoded = b""
        self._left_out_logged = 0
        if meter is not None:
            meter.create_observable_gauge(
                UNIDENTIFIED_DEVICES.name,
                callbacks=[self._observe_unidentified],
                unit=UNIDENTIFIED_DEVICES.unit,
                description=UNIDENTIFIED_DEVICES.description,
            )
            meter.create_observable_gauge(
                WATCHERS.name, callbacks=[self._observe_watchers], unit=WATCHERS.unit, description=WATCHERS.description
            )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on the socket (0600, directory created) and follow the board; raises
        :class:`~otel_dra.sinks.kubelet._socket.KubeletSocketError` when the path can't be served."""
        if self._server is not None:
            raise RuntimeError("KubeletHealthServer already started")
        server = grpc.server(
            ThreadPoolExecutor(self.max_workers, thread_name_prefix="kubelet-health"),
            handlers=[self._handler(service) for service in HEALTH_SERVICES],
            maximum_concurrent_rpcs=self.max_workers,
        )
        with self._cond:
            self._stopping = False
            self._version = self.board.version
        self._socket_id = _socket.serve_on(server, self.socket_path, log.warning)
        self._server = server
        self._follower = threading.Thread(target=self._follow_board, name="kubelet-health-follow", daemon=True)
        self._follower.start()
        log.info(
            "serving kubelet device health (%s) on %s: timeout %gs, full list on change and every %gs, "
            "up to %d streams",
            ", ".join(HEALTH_SERVICES),
            self.socket_path,
            self.health_check_timeout_s,
            self.resend_s,
            self.max_workers,
        )

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """End every stream now (the kubelet then marks the devices Unknown), stop listening within
        ``timeout_s`` and remove the socket if it is still ours."""
        grace_s = timeout_s / 2  # half for work in flight, the rest for closing
        server = self._server
        if server is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        server.stop(grace_s).wait(grace_s + 1.0)
        if self._follower is not None:
            self._follower.join(_FOLLOW_POLL_S * 4)
        _socket.remove_if_ours(self.socket_path, self._socket_id)
        self._server = self._follower = self._socket_id = None
        log.info("kubelet health server on %s stopped", self.socket_path)

    @property
    def watchers(self) -> int:
        """Streams open now."""
        with self._cond:
            return len(self._watchers)

    @property
    def unidentified(self) -> int:
        """Devices on the board the kubelet can't be told about (no pool or device name)."""
        return sum(not identified(v) for v, _ in self.board.snapshot())

    # -- the stream ------------------------------------------------------------------------
    def _handler(self, service: str) -> grpc.GenericRpcHandler:
        def watch(request: object, context: grpc.ServicerContext) -> Iterator[bytes]:
            return self._watch(service, context)

        method = grpc.unary_stream_rpc_method_handler(
            watch,
            request_deserializer=_REQUEST_TYPES[service].FromString,
            response_serializer=None,  # we yield the encoded list: built once, shared by every stream
        )
        return grpc.method_handlers_generic_handler(service, {METHOD: method})

    def _watch(self, service: str, context: grpc.ServicerContext) -> Iterator[bytes]:
        watcher = _Watcher(service)
        with self._cond:
            if self._stopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the health server is shutting down")
            self._watchers.add(watcher)
            count = len(self._watchers)
        try:
            if not context.add_callback(lambda: self._end(watcher)):
                return  # the client left before we began
            log.info("kubelet health stream opened (%s), %d open", service, count)
            while True:
                with self._cond:
                    # The board's own version, not only the follower's: a stream opened just after a
                    # change must start from it, even before the follower thread has woken up.
                    version = max(self._version, self.board.version)
                yield self._encode(version)
                while True:  # until a change, or a resend tick while the verdicts are live
                    deadline = time.monotonic() + self.resend_s
                    with self._cond:
                        while not (watcher.ended or self._stopping or self._version > version):
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(left)
                        if watcher.ended or self._stopping:
                            return
                        changed = self._version > version
                    if changed or self._live():
                        break
        finally:
            with self._cond:
                self._watchers.discard(watcher)
                count = len(self._watchers)
            log.info("kubelet health stream closed (%s), %d open", service, count)

    def _live(self) -> bool:
        """Whether periodic resends may go out (see ``liveness``); logs each flip once."""
        try:
            live = self._liveness is None or bool(self._liveness())
        except Exception as exc:  # a broken probe must not end the stream
            log.warning("kubelet health liveness probe failed; treating the verdicts as stale", exc_info=exc)
            live = False
        with self._cond:
            flipped, self._live_logged = live != self._live_logged, live
        if flipped and not live:
            log.warning("verdicts are stale: pausing kubelet health resends (the kubelet will mark devices Unknown)")
        elif flipped:
            log.info("verdicts are fresh again: resuming kubelet health resends")
        return live

    def _end(self, watcher: _Watcher) -> None:
        """grpc's termination callback: the client went away or the server is stopping."""
        with self._cond:
            watcher.ended = True
            self._cond.notify_all()

    def _follow_board(self) -> None:
        """The one thread that waits on the board; it wakes the streams when the verdicts move."""
        seen = self._version
        while True:
            with self._cond:
                if self._stopping:
                    return
            version = self.board.wait_for_change(seen, _FOLLOW_POLL_S)
            if version != seen:
                seen = version
                with self._cond:
                    self._version = version
                    self._cond.notify_all()

    def _encode(self, version: int) -> bytes:
        """The full list, encoded; rebuilt when the board moved or the second (``last_updated_time``
        of devices without a sample time is "now") changed, else shared with the other streams."""
        now_s = int(time.time())
        key = (version, now_s)
        with self._encode_lock:
            if self._encoded_key != key:
                # The snapshot is taken after ``version`` was read, so it is at least that new.
                verdicts = [v for v, _ in self.board.snapshot()]
                response, left_out = build_response(verdicts, self.timeout_field_s, now_s, self.combine_mode)
                self._encoded, self._encoded_key = response.SerializeToString(), key
                self._note_left_out(left_out)
            return self._encoded

    def _note_left_out(self, left_out: list[Verdict]) -> None:
        """One warning each time the number of unnamed devices changes (not on every resend)."""
        if len(left_out) != self._left_out_logged:
            self._left_out_logged = len(left_out)
            if left_out:
                examples = ", ".join(f"{v.node}/{v.hw_id}" for v in left_out[:3])
                log.warning(
                    "%d device(s) left out of the kubelet health stream: no dra.pool.name/dra.device.name (%s%s)",
                    len(left_out),
                    examples,
                    ", ..." if len(left_out) > 3 else "",
                )

    # -- metrics ---------------------------------------------------------------------------
    def _observe_unidentified(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.unidentified)]

    def _observe_watchers(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.watchers)]
