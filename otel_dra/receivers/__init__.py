"""Receivers: telemetry pushed to the fleet (OTLP metrics over gRPC and HTTP) into Frames."""

from otel_dra.receivers.otlp import OtlpReceiver

__all__ = ["OtlpReceiver"]
