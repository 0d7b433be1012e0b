"""Sources: where samples come from. Each produces :class:`otel_dra.frame.Frame` objects
on the same :class:`otel_dra.frame.Schema`, so the stages after them never change.

Each source class also owns its discovery: :meth:`SourceClass.probe` says what it would report
on this machine with the very code it reads with, so ``--source auto`` (:func:`choose`) can never
pick a source by one rule that then reports nothing by another (a server whose only display
device is its BMC's VGA once got sysfs chosen and no GPU reported).

Every source :func:`build` opens is bounded (:mod:`otel_dra.sources.bounds`): a node showing
thousands of devices, or a driver reporting a multi-kB serial, can't make unbounded rows or labels.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from otel_dra.frame import Frame, Schema

if TYPE_CHECKING:
    from otel_dra.decode.limits import DecodeLimits
    from otel_dra.faults import Fault


class SourceSettings(Protocol):
    """What the sources read of a configuration (the agent's :class:`~otel_dra.config.AgentConfig`
    has it): declared here, so the sources depend on no layer above them."""

    @property
    def node_name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def devices(self) -> int: ...
    @property
    def faults(self) -> tuple[Fault, ...]: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def load(self) -> str: ...
    @property
    def sysfs_root(self) -> str: ...


class SourceUnavailable(RuntimeError):
    """The chosen source can't run on this machine (a library or its driver is missing); the message
    says what is missing and what to choose instead."""


@dataclass(frozen=True)
class Probe:
    """What one source would report here, found without opening it for sampling.

    ``found`` counts the accelerators it would report: what makes ``auto`` choose it. ``others``
    counts the other devices it would report beside them (sysfs's NICs), which alone do not: the
    agent is for accelerators. ``why`` is the sentence the agent logs.
    """

    source: str
    found: int
    why: str
    others: int = 0


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


class SourceClass(Protocol):
    """The class side of a source: how ``--source`` finds, asks and opens it."""

    name: str

    def probe(self, config: SourceSettings) -> Probe:
        """What the source would report on this machine; never raises for a missing library."""
        ...

    def from_config(self, config: SourceSettings, schema: Schema) -> Source:
        """The source, opened for sampling; raises :class:`SourceUnavailable` when it can't run here."""
        ...


#: Every source by its ``--source`` name: ``module:class``, the module under this package, imported only
#: when asked for (NVML's binding is optional).
_CLASSES: dict[str, str] = {
    "simulated": "simulated:SimulatedSource",
    "nvml": "nvml:NvmlSource",
    "sysfs": "sysfs:SysfsSource",
}
#: The real sources ``auto`` asks, in order; the first that finds an accelerator is chosen. ``auto`` never
#: chooses the simulator: a node missing NVML or its ``/sys`` mount must not report healthy pretend GPUs.
AUTO_ORDER: tuple[str, ...] = ("nvml", "sysfs")
#: The source ``--fault`` asks for under ``auto`` (faults are injected into simulated devices only).
FAULT_SOURCE = "simulated"

#: ``--source`` choices. ``auto``: NVML when the library loads and finds GPUs, else sysfs when it
#: finds accelerators, else :class:`NoAccelerator` (the simulator only when asked for, or by ``--fault``).
SOURCES: tuple[str, ...] = ("auto", *_CLASSES)


class NoAccelerator(SourceUnavailable):
    """``--source auto`` found no real accelerator: the message says what each source saw and how to
    fix it, so the CLI's one line is enough (the agent does not start)."""

    def __init__(self, probes: tuple[Probe, ...]) -> None:
        self.probes = probes
        said = "; ".join(p.why for p in probes)
        super().__init__(
            f"--source auto found no accelerator ({said}): pip install 'otel-dra[nvidia]' for NVIDIA GPUs, mount the "
            "host's /sys (--sysfs-root, e.g. /host/sys in a container), or pass --source simulated for simulated GPUs"
        )


def source_class(name: str) -> SourceClass:
    """The class of the source called ``name`` (one of :data:`SOURCES` but ``auto``)."""
    module, _, attr = _CLASSES[name].partition(":")
    cls: SourceClass = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    return cls


def choose(config: SourceSettings) -> tuple[str, tuple[Probe, ...]]:
    """The source to run and the probes that decided it (none when ``--source`` names one).

    ``auto`` with ``--fault`` is the simulator (the only source faults go into; its probe says so). Otherwise
    ``auto`` asks :data:`AUTO_ORDER` in turn and stops at the first that finds an accelerator; if none does,
    it raises :class:`NoAccelerator`.
    """
    if config.source != "auto":
        return config.source, ()
    if config.faults:
        why = f"--fault given: {config.devices} simulated device(s), the only source faults are injected into"
        return FAULT_SOURCE, (Probe(FAULT_SOURCE, config.devices, why),)
    probes: list[Probe] = []
    for name in AUTO_ORDER:
        probe = source_class(name).probe(config)
        probes.append(probe)
        if probe.found > 0:
            return name, tuple(probes)
    raise NoAccelerator(tuple(probes))


def reason(name: str, probes: tuple[Probe, ...]) -> str:
    """Why ``name`` runs, for the log: each probe's answer, in the order they were asked."""
    if not probes:
        return "chosen with --source"
    return "; ".join(p.why for p in probes)


def build(config: SourceSettings, schema: Schema, limits: DecodeLimits | None = None) -> tuple[Source, str]:
    """The source ``--source`` names (``auto`` picks one), opened, and why it was chosen; its frames
    bounded by ``limits`` (default :class:`~otel_dra.decode.limits.DecodeLimits`), as the decoders' are."""
    from otel_dra.sources.bounds import BoundedSource  # here: the decoders' limits are not for the CLI's import

    name, probes = choose(config)
    return BoundedSource(source_class(name).from_config(config, schema), limits), reason(name, probes)
