"""The OTLP receiver's request path, both transports: admit (backpressure, the bearer token), decode
under the one lock, hand the frames on, count the outcome, and answer as the OTLP specification says.

Answers: success, or partial success with the number of rejected points and a one-line message
(points past a cap of :class:`~otel_dra.decode.limits.DecodeLimits` among them, counted by reason);
bytes that don't parse are INVALID_ARGUMENT (HTTP 400 with a ``google.rpc.Status`` body); a request
over ``max_request_bytes`` is RESOURCE_EXHAUSTED (HTTP 413). Neither is retryable by the client, and
neither stops the receiver. When the fleet falls behind (its queue of frames is full, or too many
requests wait to be decoded) the answer is backpressure, as the Collector's memory limiter gives it:
UNAVAILABLE with ``RetryInfo`` / HTTP 503 with ``Retry-After``, which the OTLP exporters retry.

gRPC takes the request as bytes (a generic handler for the generated service's method) rather than
through the generated servicer registration: that one parses with ``FromString`` first, which answers
INTERNAL instead of INVALID_ARGUMENT for garbage and would parse each request twice. It takes them as
a stream of one (``stream_unary``, the same bytes on the wire), so that a call can be refused before
its request is read (:mod:`~otel_dra.serve.grpc_pool`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import grpc
from aiohttp import web
from aiohttp.http import RawRequestMessage
from google.protobuf import any_pb2
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)

from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.decode.result import DecodeResult
from otel_dra.frame import Frame
from otel_dra.receivers import auth as authn
from otel_dra.receivers.auth import ClientNodes, ReceiverAuth, Speaker
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.telemetry import ATTRIBUTES_IGNORED
from otel_dra.serve.grpc_front import UNKNOWN_PEER, GrpcFront
from otel_dra.serve.grpc_pool import ReadDeadlines, ShedPool, shedding
from otel_dra.serve.http import BodyError, HttpServer, answer, gunzip, ok, read_body

if TYPE_CHECKING:
    from otel_dra.receivers.telemetry import Counts

log = logging.getLogger("otel_dra.receivers.otlp")  # (one logger for the receiver, as before the split)

HTTP_PATH: Final = "/v1/metrics"
_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"]
GRPC_SERVICE: Final = _SERVICE.full_name
GRPC_METHOD: Final = _SERVICE.methods_by_name["Export"].name
_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
#: An HTTP request body smaller than this is decoded on the event loop's thread when the decoder is free (a
#: typical agent request, about 100 kB, takes a fraction of a millisecond); a larger one, or one arriving
#: while another is decoded, on the worker, so the loop never waits.
INLINE_BYTES: Final = 256 << 10
_CONSUMER_FAILED: Final = "the receiver failed to take the request; see its log"


class Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    """The generated service's ``Export``, taking the request's bytes as a stream of one (see the module
    docstring)."""

    def __init__(self, receiver: RequestPath) -> None:
        self._receiver = receiver

    def Export(self, request: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return self._receiver._grpc_export(request, context)


class Overloaded(Exception):
    """The fleet can't take more now: the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestPath:
    """The receiver's handling of one request (:class:`~otel_dra.receivers.otlp.OtlpReceiver` is one):
    what it reads of the receiver is declared here; the servers are the receiver's, set when it starts."""

    config: ReceiverConfig
    counts: Counts
    _on_frames: Callable[[list[Frame]], None]
    _backlog: Callable[[], float | None] | None
    _client_nodes: ClientNodes
    _decoder: OtlpProtoDecoder
    _json_decoder: OtlpJsonDecoder
    _lock: threading.RLock
    _front: GrpcFront | None
    _grpc_pool: ShedPool | None
    _reads: ReadDeadlines | None
    _http: HttpServer | None

    @property
    def auth(self) -> ReceiverAuth | None:
        return self.config.auth

    @property
    def max_request_bytes(self) -> int:
        return self.config.max_request_bytes

    @property
    def mutual(self) -> bool:
        """Whether clients present certificates (mutual TLS): then each speaks only for the nodes it may."""
        return self.config.tls is not None and self.config.tls.mutual

    def _admit(self, transport: str, shed: bool = False) -> None:
        """Take a pending slot, or raise :class:`Overloaded` (counted) when the fleet is behind; ``shed``:
        the call is past the gRPC workers' bound (:class:`~otel_dra.serve.grpc_pool.ShedPool`)."""
        refused = self._slot(shed)
        if refused is None:
            return
        retry_s, why = refused
        with self.counts.lock:
            self.counts.requests[(transport, "overloaded")] += 1
        log.warning("OTLP/%s: overloaded, a request was refused for now: %s", transport, why)
        raise Overloaded(f"overloaded: {why}; retry in {round(retry_s, 1):g} s", retry_s)

    def _slot(self, shed: bool = False) -> tuple[float, str] | None:
        """Take a pending slot (None), or say why not: the retry delay, spread over a second so that a
        refused burst does not come back as one, and why. Counts nothing."""
        retry_s = self._backlog() if self._backlog is not None else None
        with self.counts.lock:
            if shed:
                return 1.0 + random.random(), (
                    f"more than {self._grpc_pool.bound if self._grpc_pool else 0} calls are waiting for a worker"
                )
            if retry_s is None and self.counts.pending >= self.config.max_pending_requests:
                return 1.0 + random.random(), f"{self.counts.pending} requests are already waiting to be decoded"
            if retry_s is None:
                self.counts.pending += 1
                return None
        return retry_s, "the fleet's queue of frames is full"

    def _release(self) -> None:
        with self.counts.lock:
            self.counts.pending -= 1

    def _unauthenticated(self, transport: str, header: str | None, peer: str) -> str | None:
        """Why a request's ``Authorization`` is refused (counted, one log line), or None to go on."""
        if self.auth is None:
            return None
        problem = self.auth.token_problem(header)
        if problem is None:
            return None
        self.counts.count(transport, "unauthenticated")
        log.warning("OTLP/%s: unauthenticated request from %s refused: %s", transport, peer, problem)
        return f"unauthenticated: {problem}; send authorization: {authn.SCHEME} <token>"

    def _take(
        self, transport: str, decode: Callable[[], DecodeResult], speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """Decode one request and hand its frames on, under the lock; count the outcome. Raises
        MalformedRequest (the client's fault), or whatever decoding or ``on_frames`` raised (ours)."""
        with self._lock:
            try:
                result = decode()
            except MalformedRequest as exc:
                self.counts.count(transport, "invalid")
                log.warning("OTLP/%s: invalid request refused: %s", transport, exc)
                raise
            except Exception:
                self.counts.count(transport, "error")
                log.exception("OTLP/%s: decoding a request failed (a bug: please report it)", transport)
                raise
            try:
                if result.frames:
                    self._on_frames(result.frames)
            except Exception:
                self.counts.count(transport, "error")
                log.exception("OTLP/%s: the frames' consumer failed; request refused", transport)
                raise
        return self._respond(transport, result, speaker)

    def export_protobuf(
        self, data: bytes, transport: str, speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """One serialized ``ExportMetricsServiceRequest`` (see :meth:`_take` for what it raises);
        ``speaker``: the nodes its client may report for (None: any)."""

        return self._take(transport, lambda: self._decoder.decode(data, speaker=speaker), speaker)

    def export_json(self, data: bytes, speaker: Speaker | None = None) -> ExportMetricsServiceResponse:
        """A request in the JSON mapping (OTLP/HTTP ``application/json``), read by the replay decoder;
        a request it can't use as a whole (not JSON, a resource without ``k8s.node.name``) is refused
        as invalid."""

        def decode() -> DecodeResult:
            result = self._json_decoder.decode(data, self._json_decoder.lines + 1, speaker=speaker)
            if result.invalid is not None:
                raise MalformedRequest(result.invalid)
            return result

        return self._take("http", decode, speaker)

    def _respond(
        self, transport: str, result: DecodeResult, speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """Success, or partial success read off the decoder's result as it is (ignored points are neither)."""
        rejected = result.rejected
        self.counts.count(transport, "partial" if rejected else "ok", result.accepted, rejected, result.ignored)
        if result.stray:
            with self.counts.lock:
                first, self.counts.stray = self.counts.stray == 0, self.counts.stray + result.stray
            if first:
                log.info(
                    "OTLP/%s: %d points carried attributes otel-dra does not read: taken, those attributes ignored "
                    "(they make no series; counted in %s)",
                    transport,
                    result.stray,
                    ATTRIBUTES_IGNORED.name,
                )
        if result.clock_jumps:  # (each already told in a warning by the decoder)
            with self.counts.lock:
                for jump in result.clock_jumps:
                    self.counts.clock_skew[jump.direction] += jump.points
        if result.limited:
            with self.counts.lock:
                for reason, n in result.limited.items():
                    self.counts.refused[reason] = self.counts.refused.get(reason, 0) + n
            if speaker is not None and speaker.refused:
                named = ", ".join(speaker.refused)
                more = speaker.refused_count - len(speaker.refused)
                log.warning(
                    "OTLP/%s: a client whose certificate names %s may not report for node %s%s: %s",
                    transport,
                    speaker.who,
                    named,
                    f" and {more:,} more" if more > 0 else "",
                    result.message,
                )
            else:
                log.warning("OTLP/%s: points refused past a limit: %s", transport, result.message)
        if not rejected:
            return ExportMetricsServiceResponse()
        message = result.message
        log.debug("OTLP/%s: partial success: %s", transport, message)
        return ExportMetricsServiceResponse(
            partial_success=ExportMetricsPartialSuccess(rejected_data_points=rejected, error_message=message)
        )

    def _too_large(self, transport: str, size: str) -> str:
        self.counts.count(transport, "too_large")
        message = f"request of {size} bytes is over the limit of {self.max_request_bytes:,} bytes"
        log.warning("OTLP/%s: %s; refused", transport, message)
        return message

    # -- gRPC --------------------------------------------------------------------------------
    def _grpc_export(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        peer = self._front.peer(context.peer()) if self._front is not None else UNKNOWN_PEER
        if self.auth is not None and self.auth.token:
            header = next((str(v) for k, v in context.invocation_metadata() if k == "authorization"), None)
            refused = self._unauthenticated("grpc", header, peer.address)
            if refused is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        speaker = self._client_nodes.cert_speaker(peer.peercert) if self.mutual else None
        try:
            self._admit("grpc", shed=shedding())
        except Overloaded as exc:  # answered before the request is read: a refusal costs no more than this
            context.set_trailing_metadata(_retry_metadata(str(exc), exc.retry_after_s))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        try:
            request = self._read_request(requests, context)  # (a call cancelled while read raises grpc.RpcError)
            if len(request) > self.max_request_bytes:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large("grpc", f"{len(request):,}"))
            try:
                response = self.export_protobuf(request, "grpc", speaker)
            except MalformedRequest as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Exception:
                context.abort(grpc.StatusCode.INTERNAL, _CONSUMER_FAILED)
        finally:
            self._release()
        return response.SerializeToString()

    def _read_request(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The call's one message, read within the body timeout (:class:`ReadDeadlines`)."""
        token = self._reads.watch(context) if self._reads is not None else None
        try:
            request = next(requests, None)
        finally:
            if token is not None and self._reads is not None:
                self._reads.done(token)
        if request is None:
            self.counts.count("grpc", "invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no ExportMetricsServiceRequest message")
        return request

    def _read_late(self) -> None:
        self.counts.count("grpc", "invalid")
        log.warning(
            "OTLP/gRPC: a request was not received within %g s of being read (--body-timeout); call cancelled",
            self.config.http.body_timeout_s,
        )

    # -- HTTP --------------------------------------------------------------------------------
    async def _http_request(self, request: web.BaseRequest) -> web.StreamResponse:
        """``POST /v1/metrics``: read the body (bounded in size and time), decode it on the worker."""
        if request.method != "POST":
            return _status(405, code_pb2.UNIMPLEMENTED, f"method not allowed: OTLP metrics go to POST {HTTP_PATH}")
        if request.path != HTTP_PATH:
            return _status(404, code_pb2.NOT_FOUND, f"not found: OTLP metrics go to POST {HTTP_PATH}")
        ctype = _media_type(request.headers)
        as_json = ctype == _JSON
        refused = self._unauthenticated("http", request.headers.get("Authorization"), request.remote or "?")
        if refused is not None:
            reply = _status(401, code_pb2.UNAUTHENTICATED, refused, as_json, close=True)
            reply.headers["WWW-Authenticate"] = f'{authn.SCHEME} realm="otel-dra"'
            return reply
        if ctype not in (_PROTOBUF, _JSON):
            self.counts.count("http", "invalid")
            return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Type {ctype[:60]!r}: use {_PROTOBUF}")
        encoding = _coding(request.headers)
        if encoding not in ("identity", "gzip"):
            self.counts.count("http", "invalid")
            return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding[:40]!r}", as_json)
        try:
            self._admit("http")
        except Overloaded as exc:
            reply = _status(503, code_pb2.UNAVAILABLE, str(exc), as_json, close=True)
            reply.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
            return reply
        try:
            return await self._http_export(request, as_json, encoding == "gzip")
        finally:
            self._release()

    async def _http_export(self, request: web.BaseRequest, as_json: bool, gz: bool) -> web.StreamResponse:
        assert self._http is not None
        speaker = None
        if self.mutual:
            transport = request.transport
            speaker = self._client_nodes.cert_speaker(transport.get_extra_info("peercert") if transport else None)
        try:
            body = await read_body(request, self.max_request_bytes, self.config.http.body_timeout_s)
        except BodyError as exc:
            return self._body_error("http", exc, as_json)
        try:
            if not gz and len(body) < INLINE_BYTES and self._lock.acquire(blocking=False):
                try:  # the decoder is free and the body small: no thread hop
                    status, data = self._exported(body, as_json, gz, speaker)
                finally:
                    self._lock.release()
            else:  # a large or gzip body, or a gRPC request decoding: the loop must not wait on the lock
                status, data = await self._http.offload(self._exported, body, as_json, gz, speaker)
        except BodyError as exc:
            return self._body_error("http", exc, as_json)
        ctype = _JSON if as_json else _PROTOBUF
        return ok(request, ctype, data) if status == 200 else web.Response(status=status, body=data, content_type=ctype)

    def _exported(self, body: bytes, as_json: bool, gz: bool, speaker: Speaker | None) -> tuple[int, bytes]:
        """A request body, read whole, taken: the HTTP status and the answer's body in the request's encoding
        (an ``ExportMetricsServiceResponse``, or a ``google.rpc.Status``). Raises :class:`BodyError` for gzip
        that can't be inflated."""
        try:
            data = gunzip(body, self.max_request_bytes) if gz else body
            response = self.export_json(data, speaker) if as_json else self.export_protobuf(data, "http", speaker)
        except MalformedRequest as exc:
            return 400, _status_body(code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        except BodyError:
            raise
        except Exception:
            return 500, _status_body(code_pb2.INTERNAL, _CONSUMER_FAILED, as_json)
        if as_json:
            return 200, MessageToJson(response, indent=None).encode()
        return 200, response.SerializeToString()

    def _http_quick(self, message: RawRequestMessage, body: bytes, transport: asyncio.BaseTransport) -> bytes | None:
        """An agent's usual push (protobuf, not compressed, authorized, small) taken on the event loop as it
        arrives, when the decoder is free and the fleet not behind: the answer's bytes. None leaves the request
        to :meth:`_http_request`, which answers every case (this one included) and counts refusals: so nothing
        here counts or logs before it is known to take the request."""
        headers = message.headers
        if (
            message.method != "POST"
            or message.path != HTTP_PATH
            or len(body) >= INLINE_BYTES
            or len(body) > self.max_request_bytes
            or _media_type(headers) != _PROTOBUF
            or _coding(headers) != "identity"
            or (self.auth is not None and self.auth.token_problem(headers.get("Authorization")) is not None)
            or not self._lock.acquire(blocking=False)
        ):
            return None
        try:
            if self._slot() is not None:
                return None
            try:
                speaker = self._client_nodes.cert_speaker(transport.get_extra_info("peercert")) if self.mutual else None
                status, data = self._exported(body, False, False, speaker)
            finally:
                self._release()
        finally:
            self._lock.release()
        return answer(status, _PROTOBUF, data)

    def _body_error(self, transport: str, exc: BodyError, as_json: bool) -> web.Response:
        """A body refused: too large (RESOURCE_EXHAUSTED), too slow or unreadable (INVALID_ARGUMENT)."""
        if exc.status == 413:
            return _status(413, code_pb2.RESOURCE_EXHAUSTED, self._too_large(transport, str(exc)), as_json, close=True)
        self.counts.count(transport, "invalid")
        log.warning("OTLP/%s: unreadable body refused: %s", transport, exc)
        return _status(exc.status, code_pb2.INVALID_ARGUMENT, str(exc), as_json, close=True)


def _retry_metadata(message: str, retry_after_s: float) -> tuple[tuple[str, bytes], ...]:
    """gRPC trailers that say when to retry: ``RetryInfo`` as the OpenTelemetry Python exporter reads it
    (``google.rpc.retryinfo-bin``) and inside the rich status the Go exporter reads (``grpc-status-details-bin``)."""
    delay = Duration(seconds=int(retry_after_s), nanos=int((retry_after_s % 1) * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return (
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )


def _media_type(headers: Mapping[str, str]) -> str:
    """A request's ``Content-Type`` without its parameters, lower case."""
    return headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


def _coding(headers: Mapping[str, str]) -> str:
    """A request's ``Content-Encoding``, lower case; ``identity`` when it has none."""
    return headers.get("Content-Encoding", "").strip().lower() or "identity"


def _status_body(code: int, message: str, as_json: bool = False) -> bytes:
    """A ``google.rpc.Status``, as OTLP/HTTP wants an error's body, in the request's encoding."""
    if as_json:
        return json.dumps({"code": code, "message": message}).encode()
    return status_pb2.Status(code=code, message=message).SerializeToString()


def _status(status: int, code: int, message: str, as_json: bool = False, close: bool = False) -> web.Response:
    """An error as OTLP/HTTP wants it: a ``google.rpc.Status`` in the request's encoding."""
    reply = web.Response(
        status=status, body=_status_body(code, message, as_json), content_type=_JSON if as_json else _PROTOBUF
    )
    if close:
        reply.force_close()
    return reply
