"""Sources: where samples come from. Each produces :class:`otel_dra.frame.Frame` objects
on the same :class:`otel_dra.frame.Schema`, so the stages after them never change."""

from __future__ import annotations

from typing import Protocol

from otel_dra.frame import Frame, Schema


class SourceUnavailable(RuntimeError):
    """The chosen source can't run on this machine (a library or its driver is missing); the message
    says what is missing and what to choose instead."""


class Source(Protocol):
    """A sampler of one node's devices."""

    #: Name shown in logs and ``--source``.
    name: str
    schema: Schema

    def read(self, now_unix_nano: int) -> Frame:
        """One sampling pass. A device that could not be read has NaN in its row."""
        ...

    def close(self) -> None:
        """Release handles (libraries, files)."""
        ...


#: ``--source`` choices. ``auto``: NVML when the library loads and finds GPUs, else sysfs when it
#: finds devices, else the simulator.
SOURCES: tuple[str, ...] = ("auto", "simulated", "nvml", "sysfs")
