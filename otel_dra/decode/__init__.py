"""Decoders of recorded telemetry into Frames (replay and fleet input)."""

from otel_dra.decode.otlp_json import DecodeError, InputFileError, OtlpJsonDecoder, read_lines

__all__ = ["DecodeError", "InputFileError", "OtlpJsonDecoder", "read_lines"]
