"""Decoders of telemetry into Frames: OTLP JSON lines (replay) and OTLP protobuf (the fleet's receiver),
two ways to walk their input over one base (:mod:`otel_dra.decode.core`) and one result
(:mod:`otel_dra.decode.result`); each concept between them has its module here."""

from otel_dra.decode.files import InputFileError, read_lines
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.decode.result import DecodeError, DecodeResult

__all__ = [
    "DecodeError",
    "DecodeResult",
    "InputFileError",
    "MalformedRequest",
    "OtlpJsonDecoder",
    "OtlpProtoDecoder",
    "read_lines",
]
