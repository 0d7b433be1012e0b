"""A Linux sysfs source: GPUs, accelerators and NICs read from the kernel's files, no libraries.

Why: every Linux node has sysfs, so a node without NVML, amdsmi or a vendor exporter still gets
temperatures, fans, power, PCIe link state and error counters for its devices. Everything is read
relative to ``root`` (``/sys`` by default) with the kernel's layout, so tests point it at a fake tree.

Mapping decisions (only metrics and attributes of ``otel_dra.conventions``, registered in
``semconv/registry.yaml``):

- PCIe AER ``aer_dev_correctable`` TOTAL → ``hw.errors{error.type=link, hw.link.type=pcie}``
  (replays, bad TLP/DLLP: the contract's "link errors"). ``aer_dev_nonfatal`` / ``aer_dev_fatal``
  TOTALs → the same ``error.type=link, hw.link.type=pcie`` with ``hw.error.code`` =
  ``TOTAL_ERR_NONFATAL`` / ``TOTAL_ERR_FATAL`` (the kernel's own names), so severity is kept apart
  without leaving the vocabulary; the classifier counts all three as link errors.
- hwmon ``temp*_max`` → ``high.degraded``; ``temp*_crit`` → ``high.critical``, falling back to
  ``temp*_emergency`` only when there is no ``_crit`` (on amdgpu "emergency" lies above "crit").
- amdgpu RAS ``ras/*_err_count`` ``ue``/``ce`` summed → ``error.type=uncorrected``/``corrected``,
  except ``xgmi_wafl`` (the XGMI link) → ``error.type=link, hw.link.type=xgmi``.
- NIC ``carrier`` is *not* mapped to ``hw.status``: a pulled cable or an unused port is not a failed
  device, and the classifier would make it Unhealthy. ``rx_errors + tx_errors`` →
  ``hw.errors{error.type=link, hw.link.type=other}``. Byte counters are left out: ``hw.gpu.io`` is
  GPU I/O and the conventions have no network I/O metric.
- ``dra.driver.name`` is left out: sysfs does not know which DRA driver publishes a device.
- Topology, read once when a device is discovered (it does not change while the device is there):
  ``hw.pcie.address`` is the device's PCI address and ``hw.pcie.upstream`` the switch upstream port or root
  port above it (:mod:`otel_dra.sources.pci_topology`); a NIC gets both from its PCI function. An amdgpu in an
  xGMI hive gets ``hw.fabric.id`` = ``xgmi/<hive id>``, the decimal id from
  ``xgmi_hive_info/xgmi_hive_id`` (``drivers/gpu/drm/amd/amdgpu/amdgpu_xgmi.c``). The ``xgmi/`` prefix keeps
  it apart from an NVLink fabric's ``<clusterUuid>/<cliqueId>``.
- amdgpu throttle causes → ``hw.throttle.time{hw.throttle.reason}`` (seconds, cumulative), from the binary
  ``gpu_metrics`` file (layouts: the kernel's ``drivers/gpu/drm/amd/include/kgd_pp_interface.h``). What
  amdgpu tells, by table version (``format_revision.content_revision`` of its header):

  * **v1.3** (MI100, MI200, RDNA2/RDNA3 dGPUs): ``indep_throttle_status``, a u64 of the throttlers active
    now, ASIC-independent bits of ``drivers/gpu/drm/amd/pm/swsmu/inc/amdgpu_smu.h`` (``SMU_THROTTLER_*_BIT``).
    No time counters: the bits are sampled each pass and the reasons seen at one pass are credited with
    the time to the next (the first pass is a baseline), as NVML's bitmask is. Package power tracking and
    current limits (PPT0-3, SPL, FPPT, SPPT, SPPT_APU, TDC_*, EDC_*, APCC) → ``power_cap``; the firmware's
    temperature limits (TEMP_GPU ... TEMP_LIQUID1, VR temperatures included) → ``thermal``; VRHOT0/1 and
    PROCHOT_CPU/GFX (hardware signals) → ``hw_slowdown``; PPM and FIT → ``other``.
  * **v1.7, v1.8** (MI300 series, newer kernels): ``accumulation_counter`` and the accumulated residencies
    ``ppt_residency_acc`` → ``power_cap``, ``socket_thm_``/``vr_thm_``/``hbm_thm_residency_acc`` →
    ``thermal`` (their largest: the union is not reported), ``prochot_residency_acc`` → ``hw_slowdown``.
    A residency counts the accumulation cycles its throttler was active, so the throttled share of a pass
    is its increase over the cycle counter's (as amd-smi computes PVIOL/TVIOL), times the pass's
    duration; both are u32 and wrap.

  Not read: v1.0-1.2 (``throttle_status`` only, ASIC-dependent bits), v1.4-1.5 (MI300: ``throttle_status``
  only), v1.6 (its residency fields moved between kernel releases under the same version), v1.9 and later
  (attribute-encoded) and the APU tables v2.x/v3.x. Compared with NVML, amdgpu has **no power-brake
  signal** (nothing says the board or the node's power controller asserted it: PROCHOT may be driven from
  outside but is not told apart, so it is ``hw_slowdown`` and ``power_brake`` is never reported), no
  cumulative per-cause time before v1.6 (v1.3 is sampled, so a cause shorter than a pass can be missed or
  over-counted), no sync-boost or clock-setting causes, and no idle flag (an idle GPU simply shows no bit).
"""

from __future__ import annotations

import errno
import math
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from otel_dra import conventions as cv
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources import Probe
from otel_dra.sources.pci_topology import pcie_place

if TYPE_CHECKING:
    from otel_dra.sources import SourceSettings

VENDORS: dict[str, str] = {"0x1002": "AMD", "0x10de": "NVIDIA", "0x8086": "Intel"}
#: PCI base classes of accelerators: 0x03 display (only for the GPU vendors above, so a BMC's VGA
#: is not taken for one), 0x12 processing accelerators (any vendor).
DISPLAY_CLASS, ACCELERATOR_CLASS = 0x03, 0x12
#: "16.0 GT/s PCIe" → generation.
GENERATIONS: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
#: errnos that mean "this file is simply not there" (an optional signal), not "the device failed".
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR})
_TEMP_LIMITS = (("max", "high.degraded"), ("crit", "high.critical"), ("emergency", "high.critical"))
_AER = (
    ("aer_dev_correctable", "TOTAL_ERR_COR", None),
    ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_NONFATAL"),
    ("aer_dev_fatal", "TOTAL_ERR_FATAL", "TOTAL_ERR_FATAL"),
)

#: gpu_metrics (kgd_pp_interface.h), little-endian as the GPU's host writes it. Offsets are the kernel
#: structs' as the C compiler lays them out (naturally aligned): struct metrics_table_header
#: {u16 structure_size; u8 format_revision; u8 content_revision}; gpu_metrics_v1_3.indep_throttle_status
#: (u64) at 112 of 120 bytes; gpu_metrics_v1_7 / _v1_8 (2208 / 3872 bytes) share their first 64 bytes:
#: accumulation_counter (u32) at 40, then prochot, ppt, socket_thm, vr_thm, hbm_thm _residency_acc (u32).
_GPU_METRICS_HEADER = struct.Struct("<HBB")
_V1_3_INDEP_THROTTLE = struct.Struct("<Q"), 112
_V1_7_RESIDENCIES = struct.Struct("<6I"), 40
_RESIDENCY_VERSIONS = ((1, 7), (1, 8))
#: amdgpu_smu.h SMU_THROTTLER_*_BIT (ASIC-independent throttlers) → hw.throttle.reason.
_INDEP_THROTTLERS: dict[str, tuple[int, ...]] = {
    # PPT0-3 0-3, SPL 4, FPPT 5, SPPT 6, SPPT_APU 7; TDC_GFX/SOC/MEM/VDD/CVIP 16-20, EDC_CPU/GFX 21-22, APCC 23
    "power_cap": (*range(0, 8), *range(16, 24)),
    # TEMP_GPU 32, CORE, MEM, EDGE, HOTSPOT, SOC, VR_GFX, VR_SOC, VR_MEM0, VR_MEM1, LIQUID0, LIQUID1 43
    "thermal": tuple(range(32, 44)),
    # VRHOT0 44, VRHOT1 45, PROCHOT_CPU 46, PROCHOT_GFX 47
    "hw_slowdown": (44, 45, 46, 47),
    # PPM 56, FIT 57
    "other": (56, 57),
}
#: The reasons amdgpu can report (no power brake); the order of _V1_7_RESIDENCIES after the cycle counter.
AMD_THROTTLE_REASONS = ("thermal", "power_cap", "hw_slowdown", "other")
_RESIDENCY_REASONS = ("hw_slowdown", "power_cap", "thermal", "thermal", "thermal")
_U32 = 1 << 32


class DeviceUnreadable(Exception):
    """The device's files exist but cannot be read (EIO, ENODEV, removed mid-pass)."""


def dns_label(text: str) -> str:
    """A DNS-label-safe form of a device id (``0000:03:00.0`` → ``0000-03-00-0``), for dra.device.name."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return label or "device"


def _read(path: Path) -> str | None:
    """A sysfs file's text; None when it does not exist. Other errors mean the device is in trouble."""
    try:
        return path.read_text().strip()
    except OSError as err:
        if err.errno in _ABSENT:
            return None
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.EAGAIN):
            return None  # the attribute does not apply now (e.g. carrier of a down interface)
        raise DeviceUnreadable(f"{path}: {err}") from err


def _number(path: Path, scale: float = 1.0) -> float:
    """A numeric sysfs file times ``scale``; NaN when absent or not a number."""
    text = _read(path)
    if text is None:
        return math.nan
    try:
        return float(text.split()[0]) * scale
    except (ValueError, IndexError):
        return math.nan


def _total(path: Path, key: str) -> float:
    """The ``KEY count`` line of an AER counter file; NaN when absent."""
    text = _read(path)
    if text is None:
        return math.nan
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return float(parts[1])
    return math.nan


def link_generation(speed: str | None) -> float:
    """PCIe generation from ``current_link_speed`` text ("16.0 GT/s PCIe" → 4); NaN if unknown."""
    if not speed:
        return math.nan
    try:
        return float(GENERATIONS.get(float(speed.split()[0]), math.nan))
    except ValueError:
        return math.nan


def _read_bytes(path: Path) -> bytes | None:
    """A binary sysfs file (``gpu_metrics``); None when absent or not available now, as :func:`_read`."""
    try:
        return path.read_bytes()
    except OSError as err:
        if err.errno in _ABSENT or err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.EAGAIN):
            return None
        raise DeviceUnreadable(f"{path}: {err}") from err


@dataclass
class _Throttle:
    """One amdgpu's throttle time so far: the previous pass's time and what it read (reasons bitmask of
    v1.3, or v1.7+ cycle counter and residencies), and the seconds credited per reason."""

    version: tuple[int, int] | None = None
    last_ns: int | None = None
    last: tuple[int, ...] = ()
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(AMD_THROTTLE_REASONS, 0.0))


def _u32_increase(new: int, old: int) -> int | None:
    """How much a u32 accumulator grew, across one wrap; None when it went back (a reset)."""
    if new >= old:
        return new - old
    if old >= 3 * _U32 // 4 and new < _U32 // 4:  # wrapped
        return new + _U32 - old
    return None


def gpu_metrics_throttle(data: bytes) -> tuple[tuple[int, int], tuple[int, ...]] | None:
    """The throttle data of a ``gpu_metrics`` table: ``((1, 3), (indep_throttle_status,))`` or
    ``((1, 7|8), (accumulation_counter, prochot, ppt, socket_thm, vr_thm, hbm_thm))``; None for another
    version or a table shorter than its structure."""
    if len(data) < _GPU_METRICS_HEADER.size:
        return None
    size, frev, crev = _GPU_METRICS_HEADER.unpack_from(data)
    version = (frev, crev)
    if version == (1, 3):
        fmt, offset = _V1_3_INDEP_THROTTLE
    elif version in _RESIDENCY_VERSIONS:
        fmt, offset = _V1_7_RESIDENCIES
    else:
        return None
    if len(data) < max(size, offset + fmt.size):
        return None
    return version, fmt.unpack_from(data, offset)


def _pci_class(dev: Path) -> int | None:
    text = _read(dev / "class")
    try:
        return int(text, 16) >> 16 if text else None
    except ValueError:
        return None


def _is_accelerator(dev: Path) -> bool:
    try:
        base = _pci_class(dev)
        vendor = _read(dev / "vendor")
    except DeviceUnreadable:
        return False
    return base == ACCELERATOR_CLASS or (base == DISPLAY_CLASS and vendor in VENDORS)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _other_displays(pci: Path) -> list[str]:
    """``bdf (vendor)`` of display devices :func:`_is_accelerator` leaves out, so a probe can say why."""
    skipped = []
    for bdf in _listdir(pci):
        try:
            if _pci_class(pci / bdf) == DISPLAY_CLASS and not _is_accelerator(pci / bdf):
                skipped.append(f"{bdf} ({_read(pci / bdf / 'vendor') or 'no vendor'})")
        except DeviceUnreadable:
            continue
    return skipped


def _discover(root: Path) -> list[tuple[str, str, Path]]:
    """(hw.id, hw.type, directory) of every device under ``root``, in a stable order."""
    found: list[tuple[str, str, Path]] = []
    pci = root / "bus" / "pci" / "devices"
    for bdf in _listdir(pci):
        if _is_accelerator(pci / bdf):
            found.append((bdf, "gpu", pci / bdf))
    net = root / "class" / "net"
    for iface in _listdir(net):
        if iface != "lo" and (net / iface / "device").exists():  # virtual interfaces have no device
            found.append((iface, "network", net / iface))
    return found


@dataclass
class _Reading:
    """One device's pass: column index → value, and its descriptive attributes."""

    values: dict[int, float] = field(default_factory=dict)
    attrs: dict[str, str] = field(default_factory=dict)


class SysfsSource:
    """The node's accelerators and NICs, read from sysfs each pass."""

    name = "sysfs"

    def __init__(self, node_name: str, root: str = "/sys", schema: Schema | None = None) -> None:
        self.node_name = node_name
        self.root = Path(root)
        self.schema = schema if schema is not None else Schema()
        self._dirs: dict[str, tuple[str, Path]] = {}  # hw.id → (hw.type, directory), in first-seen order
        self._attrs: dict[str, dict[str, str]] = {}  # last known attributes, kept while unreadable
        self._throttle: dict[str, _Throttle] = {}  # hw.id → amdgpu throttle time so far
        self._topology: dict[str, dict[str, str]] = {}  # hw.id → its place, read once at discovery
        self._table: DeviceTable | None = None

    @classmethod
    def probe(cls, config: SourceSettings) -> Probe:
        """What a pass on ``config.sysfs_root`` would report: the accelerators :meth:`read` discovers
        (the same :func:`_discover`), with the NICs beside them and the display devices it skips."""
        root = Path(config.sysfs_root)
        devices = _discover(root)
        gpus = [d for d, kind, _ in devices if kind == "gpu"]
        nics = [d for d, kind, _ in devices if kind == "network"]
        nic_text = f" and {len(nics)} physical NIC(s) {nics}" if nics else ""
        if gpus:
            why = f"sysfs shows {len(gpus)} PCI accelerator(s) {gpus}{nic_text} under {root}"
            return Probe(cls.name, len(gpus), why, len(nics))
        why = f"sysfs shows no PCI accelerator (a display device of {'/'.join(VENDORS.values())}, or class 0x12)"
        skipped = _other_displays(root / "bus" / "pci" / "devices")
        if skipped:
            why += f"; skipped display device(s) of other vendors {skipped} (a BMC's VGA is one)"
        return Probe(cls.name, 0, f"{why}{nic_text} under {root}", len(nics))

    @classmethod
    def from_config(cls, config: SourceSettings, schema: Schema) -> SysfsSource:
        """The source on ``config.sysfs_root``, for :func:`otel_dra.sources.build`."""
        return cls(config.node_name, config.sysfs_root, schema)

    # -- columns --------------------------------------------------------------------------------
    def _col(self, metric: str, attrs: dict[str, str] | None = None, sensor: str | None = None, kind: str = "") -> int:
        return self.schema.index(Column(metric, attrs_of(attrs or {}), sensor, kind or None))

    def _put(self, r: _Reading, value: float, metric: str, attrs: dict[str, str] | None = None, **kw: str) -> None:
        if not math.isnan(value):
            r.values[self._col(metric, attrs, kw.get("sensor"), kw.get("kind", ""))] = value

    # -- readers --------------------------------------------------------------------------------
    @staticmethod
    def _place(kind: str, path: Path) -> dict[str, str]:
        """A device's topology attributes (module docstring), read at discovery; {} for what sysfs does not tell."""
        pci = path / "device" if kind == "network" else path
        address, upstream = pcie_place(pci)
        attrs = {cv.HW_PCIE_ADDRESS: address} if address else {}
        if upstream:
            attrs[cv.HW_PCIE_UPSTREAM] = upstream
        try:
            hive = _read(pci / "xgmi_hive_info" / "xgmi_hive_id") if kind == "gpu" else None
        except DeviceUnreadable:
            hive = None  # descriptive only: the device goes without it
        if hive and hive.isdigit() and int(hive):
            attrs[cv.HW_FABRIC_ID] = f"xgmi/{int(hive)}"
        return attrs

    def _read_pci(self, dev: Path, r: _Reading) -> None:
        """PCI identity, AER counters and link width/generation."""
        vendor = _read(dev / "vendor")
        if vendor in VENDORS:
            r.attrs[cv.HW_VENDOR] = VENDORS[vendor]
        model = _read(dev / "device")
        if model:
            r.attrs[cv.HW_MODEL] = model
        for fname, key, code in _AER:
            attrs = {cv.ERROR_TYPE_ATTR: "link", cv.HW_LINK_TYPE: "pcie"}
            if code is not None:
                attrs[cv.HW_ERROR_CODE] = code
            self._put(r, _total(dev / fname, key), cv.HW_ERRORS.name, attrs)
        self._put(r, _number(dev / "current_link_width"), cv.HW_PCIE_LINK_WIDTH.name)
        self._put(r, _number(dev / "max_link_width"), cv.HW_PCIE_LINK_WIDTH_LIMIT.name, {cv.HW_LIMIT_TYPE: "max"})
        self._put(r, link_generation(_read(dev / "current_link_speed")), cv.HW_PCIE_LINK_GENERATION.name)
        self._put(
            r,
            link_generation(_read(dev / "max_link_speed")),
            cv.HW_PCIE_LINK_GENERATION_LIMIT.name,
            {cv.HW_LIMIT_TYPE: "max"},
        )

    def _channels(self, hwmon: Path, prefix: str) -> Iterator[tuple[str, str]]:
        """(n, sensor name) of each ``<prefix><n>_input`` channel; the name is its label, else n."""
        for fname in _listdir(hwmon):
            m = re.fullmatch(rf"{prefix}(\d+)_(input|average)", fname)
            if m and (prefix != "power" or m.group(2) == "average" or not (hwmon / f"power{m[1]}_average").exists()):
                label = _read(hwmon / f"{prefix}{m[1]}_label")
                yield m[1], (label.strip().lower().replace(" ", "_") if label else m[1])

    def _read_hwmon(self, dev: Path, r: _Reading) -> None:
        """Temperatures, fans, power, energy and voltages from every ``hwmon*`` under the device."""
        for hw in _listdir(dev / "hwmon"):
            h = dev / "hwmon" / hw
            for n, label in self._channels(h, "temp"):
                sensor = f"temp/{label}"
                loc = {cv.HW_SENSOR_LOCATION: label} if label != n else {}
                value = _number(h / f"temp{n}_input", 1e-3)
                self._put(r, value, cv.HW_TEMPERATURE.name, loc, sensor=sensor, kind="temperature")
                done: set[str] = set()
                for suffix, limit in _TEMP_LIMITS:
                    v = _number(h / f"temp{n}_{suffix}", 1e-3)
                    if limit not in done and not math.isnan(v):
                        done.add(limit)
                        attrs = {**loc, cv.HW_LIMIT_TYPE: limit}
                        self._put(r, v, cv.HW_TEMPERATURE_LIMIT.name, attrs, sensor=sensor, kind="temperature")
            for n, label in self._channels(h, "fan"):
                sensor = f"fan/{label}"
                rpm, top = _number(h / f"fan{n}_input"), _number(h / f"fan{n}_max")
                self._put(r, rpm, cv.HW_FAN_SPEED.name, sensor=sensor, kind="fan")
                if top > 0:
                    self._put(r, rpm / top, cv.HW_FAN_SPEED_RATIO.name, sensor=sensor, kind="fan")
                    self._put(r, top, cv.HW_FAN_SPEED_LIMIT.name, {cv.HW_LIMIT_TYPE: "max"}, sensor=sensor, kind="fan")
                low = {cv.HW_LIMIT_TYPE: "low.critical"}
                self._put(r, _number(h / f"fan{n}_min"), cv.HW_FAN_SPEED_LIMIT.name, low, sensor=sensor, kind="fan")
            for n, label in self._channels(h, "in"):
                sensor = f"volt/{label}"
                self._put(r, _number(h / f"in{n}_input", 1e-3), cv.HW_VOLTAGE.name, sensor=sensor, kind="voltage")
                for suffix, limit in (("min", "low.critical"), ("max", "high.critical")):
                    v = _number(h / f"in{n}_{suffix}", 1e-3)
                    attrs = {cv.HW_LIMIT_TYPE: limit}
                    self._put(r, v, cv.HW_VOLTAGE_LIMIT.name, attrs, sensor=sensor, kind="voltage")
            # One power and one energy per device (the device has no sensor children for them): the first channel.
            for n, _ in self._channels(h, "power"):
                watts = _number(h / f"power{n}_average", 1e-6)
                if math.isnan(watts):
                    watts = _number(h / f"power{n}_input", 1e-6)
                self._put(r, watts, cv.HW_POWER.name)
                self._put(r, _number(h / f"power{n}_cap", 1e-6), cv.HW_POWER_LIMIT.name, {cv.HW_LIMIT_TYPE: "max"})
                break
            for n, _ in self._channels(h, "energy"):
                self._put(r, _number(h / f"energy{n}_input", 1e-6), cv.HW_ENERGY.name)
                break

    def _read_throttle(self, hw_id: str, dev: Path, r: _Reading, now_ns: int) -> None:
        """``hw.throttle.time`` by reason from ``gpu_metrics`` (module docstring); nothing when the table is
        absent or of a version not read, and a new baseline after a pass without it."""
        state = self._throttle.setdefault(hw_id, _Throttle())
        data = _read_bytes(dev / "gpu_metrics")
        found = gpu_metrics_throttle(data) if data is not None else None
        if found is None:
            state.last_ns = None
            return
        version, now = found
        if state.version != version:  # first table, or the driver changed: start over from here
            state.version, state.last_ns = version, None
        if state.last_ns is not None and now_ns > state.last_ns:
            elapsed = (now_ns - state.last_ns) * 1e-9
            if version == (1, 3):
                for reason, bits in _INDEP_THROTTLERS.items():
                    if any(state.last[0] >> bit & 1 for bit in bits):
                        state.seconds[reason] += elapsed
            else:
                self._credit_residencies(state, now, elapsed)
        state.last_ns, state.last = now_ns, now
        reasons = AMD_THROTTLE_REASONS if version == (1, 3) else set(_RESIDENCY_REASONS)
        for reason in AMD_THROTTLE_REASONS:
            if reason in reasons:
                self._put(r, state.seconds[reason], cv.HW_THROTTLE_TIME.name, {cv.HW_THROTTLE_REASON: reason})

    @staticmethod
    def _credit_residencies(state: _Throttle, now: tuple[int, ...], elapsed: float) -> None:
        """Credit each reason with its share of the cycles since the last pass (the largest share where
        several residencies feed one reason); nothing when the cycle counter did not move or was reset."""
        cycles = _u32_increase(now[0], state.last[0])
        if not cycles:
            return
        share: dict[str, float] = {}
        for reason, new, old in zip(_RESIDENCY_REASONS, now[1:], state.last[1:], strict=True):
            grew = _u32_increase(new, old)
            if grew is None:
                return
            share[reason] = max(share.get(reason, 0.0), min(1.0, grew / cycles))
        for reason, fraction in share.items():
            state.seconds[reason] += fraction * elapsed

    def _read_amdgpu(self, dev: Path, r: _Reading) -> None:
        """amdgpu's own files: busy percent, VRAM, RAS error counts, VBIOS and serial."""
        busy = _number(dev / "gpu_busy_percent", 0.01)
        self._put(r, busy, cv.HW_GPU_UTILIZATION.name, {cv.HW_GPU_TASK: "general"})
        used, total = _number(dev / "mem_info_vram_used"), _number(dev / "mem_info_vram_total")
        self._put(r, used, cv.HW_GPU_MEMORY_USAGE.name)
        self._put(r, total, cv.HW_GPU_MEMORY_LIMIT.name)
        if total > 0:
            self._put(r, used / total, cv.HW_GPU_MEMORY_UTILIZATION.name)
        counts: dict[tuple[str, str], float] = {}
        for fname in _listdir(dev / "ras"):
            if not fname.endswith("_err_count"):
                continue
            text = _read(dev / "ras" / fname) or ""
            link = fname.startswith("xgmi")
            for line in text.splitlines():
                key, _, num = line.partition(":")
                etype = {"ue": "uncorrected", "ce": "corrected"}.get(key.strip())
                if etype is None or not num.strip().isdigit():
                    continue
                slot = ("link", "xgmi") if link else (etype, "")
                counts[slot] = counts.get(slot, 0.0) + float(num)
        for (etype, link_type), count in counts.items():
            attrs = {cv.ERROR_TYPE_ATTR: etype}
            if link_type:
                attrs[cv.HW_LINK_TYPE] = link_type
            self._put(r, count, cv.HW_ERRORS.name, attrs)
        for fname, attr in (("vbios_version", cv.HW_FIRMWARE_VERSION), ("serial_number", cv.HW_SERIAL_NUMBER)):
            found = _read(dev / fname)
            if found:
                r.attrs[attr] = found

    def _read_nic(self, iface: Path, r: _Reading) -> None:
        """A NIC's error counters, plus its PCI function's AER and link state when it has one."""
        stats = iface / "statistics"
        errors = _number(stats / "rx_errors") + _number(stats / "tx_errors")
        self._put(r, errors, cv.HW_ERRORS.name, {cv.ERROR_TYPE_ATTR: "link", cv.HW_LINK_TYPE: "other"})
        pci = iface / "device"
        if (pci / "class").exists():
            self._read_pci(pci, r)
        else:
            vendor = _read(pci / "vendor")
            if vendor in VENDORS:
                r.attrs[cv.HW_VENDOR] = VENDORS[vendor]

    def _read_device(self, hw_id: str, kind: str, path: Path, now_ns: int) -> _Reading:
        r = _Reading(attrs={cv.HW_TYPE: kind, cv.HW_NAME: hw_id})
        if not path.is_dir():
            raise DeviceUnreadable(f"{path}: gone")
        if kind == "gpu":
            self._read_pci(path, r)
            self._read_hwmon(path, r)
            if (path / "gpu_busy_percent").exists() or (path / "mem_info_vram_total").exists():
                self._read_amdgpu(path, r)
                self._read_throttle(hw_id, path, r, now_ns)
        else:
            self._read_nic(path, r)
        driver = path / "device" / "driver" if kind == "network" else path / "driver"
        version = _read(driver / "module" / "version") if driver.is_symlink() else None
        if version:
            r.attrs[cv.HW_DRIVER_VERSION] = version
        if not path.is_dir():  # removed while we read it: what we got may be half a device
            raise DeviceUnreadable(f"{path}: removed during the pass")
        r.attrs.update(self._topology.get(hw_id, {}))
        r.attrs[cv.DRA_POOL_NAME] = self.node_name
        r.attrs[cv.DRA_DEVICE_NAME] = dns_label(hw_id)
        return r

    # -- the source protocol --------------------------------------------------------------------
    def read(self, now_unix_nano: int) -> Frame:
        """One pass over every device seen so far (new ones join); an unreadable device gets a NaN row."""
        for hw_id, kind, path in _discover(self.root):
            if hw_id not in self._dirs:
                self._dirs[hw_id] = (kind, path)
                self._topology[hw_id] = self._place(kind, path)
        ids = tuple(self._dirs)
        readings: list[_Reading | None] = []
        for hw_id in ids:
            kind, path = self._dirs[hw_id]
            try:
                reading: _Reading | None = self._read_device(hw_id, kind, path, now_unix_nano)
            except (DeviceUnreadable, OSError):
                reading = None
                if hw_id in self._throttle:
                    self._throttle[hw_id].last_ns = None  # sampled time restarts from a new baseline
            readings.append(reading)
            if reading is not None:
                self._attrs[hw_id] = reading.attrs
            else:
                self._attrs.setdefault(
                    hw_id,
                    {
                        cv.HW_TYPE: kind,
                        cv.HW_NAME: hw_id,
                        cv.DRA_POOL_NAME: self.node_name,
                        cv.DRA_DEVICE_NAME: dns_label(hw_id),
                        **self._topology.get(hw_id, {}),
                    },
                )
        values = np.full((len(ids), len(self.schema)), np.nan)
        for row, reading in enumerate(readings):
            if reading is not None and reading.values:
                cols = np.fromiter(reading.values.keys(), dtype=np.intp, count=len(reading.values))
                values[row, cols] = np.fromiter(reading.values.values(), dtype=float, count=len(reading.values))
        attrs = tuple(self._attrs[i] for i in ids)
        if self._table is None or self._table.ids != ids or self._table.attrs != attrs:
            self._table = DeviceTable(self.node_name, ids, tuple(dict(a) for a in attrs))
        return Frame(now_unix_nano, self._table, values)

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within a pass."""
