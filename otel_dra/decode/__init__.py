"""Decoders of telemetry into Frames: OTLP JSON lines (replay) and OTLP protobuf (the fleet's receiver)."""

from otel_dra.decode.otlp_json import DecodeError, InputFileError, OtlpJsonDecoder, read_lines
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder, ProtoDecodeResult

__all__ = [
    "DecodeError",
    "InputFileError",
    "MalformedRequest",
    "OtlpJsonDecoder",
    "OtlpProtoDecoder",
    "ProtoDecodeResult",
    "read_lines",
]
