"""Decoders of telemetry into Frames: OTLP JSON lines (replay) and OTLP protobuf (the fleet's receiver),
two ways to walk their input over one core (:mod:`otel_dra.decode.core`) and one result."""

from otel_dra.decode.core import DecodeError, DecodeResult
from otel_dra.decode.otlp_json import InputFileError, OtlpJsonDecoder, read_lines
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder

__all__ = [
    "DecodeError",
    "DecodeResult",
    "InputFileError",
    "MalformedRequest",
    "OtlpJsonDecoder",
    "OtlpProtoDecoder",
    "read_lines",
]
