"""Receivers: telemetry pushed to the fleet (OTLP metrics over gRPC and HTTP) into Frames.

``OtlpReceiver`` is imported on first use, so that ``otel_dra.receivers.config`` (which the CLI
reads for its defaults) does not pull in grpc and protobuf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_dra.receivers.otlp import OtlpReceiver

__all__ = ["OtlpReceiver"]


def __getattr__(name: str) -> Any:
    if name == "OtlpReceiver":
        from otel_dra.receivers.otlp import OtlpReceiver

        return OtlpReceiver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
