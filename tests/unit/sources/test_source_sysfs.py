"""The sysfs source reads the kernel's file layout: fake trees (a committed AMD node and ones built
per test) check every signal, its unit scaling and limit mapping, a device vanishing mid-run, and
that the real classifier turns what it reads into verdicts. One test reads this machine's /sys."""

from __future__ import annotations

import ctypes
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from otel_dra import conventions as cv
from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier
from otel_dra.config import AgentConfig
from otel_dra.frame import Column, Frame, attrs_of
from otel_dra.sources.sysfs import SysfsSource, dns_label, link_generation

DATA = Path(__file__).resolve().parents[2] / "data" / "sysfs-amd"
BDF = "0000:03:00.0"
S = 10**9
T0 = 1_764_000_000 * S


def _config(root: Path | str) -> AgentConfig:
    return AgentConfig(node_name="n", source="sysfs", sysfs_root=str(root))


class FakeSysfs:
    """Writes a sysfs tree in the kernel's layout: PCI accelerators with hwmon and amdgpu files, NICs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str | int) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n")

    def pci(self, bdf: str, vendor: str = "0x1002", device: str = "0x740f", klass: str = "0x038000") -> str:
        base = f"bus/pci/devices/{bdf}"
        self.write(f"{base}/vendor", vendor)
        self.write(f"{base}/device", device)
        self.write(f"{base}/class", klass)
        return base

    def aer(self, base: str, correctable: int = 0, nonfatal: int = 0, fatal: int = 0) -> None:
        self.write(f"{base}/aer_dev_correctable", f"RxErr 0\nBadTLP {correctable}\nTOTAL_ERR_COR {correctable}")
        self.write(f"{base}/aer_dev_nonfatal", f"Undefined 0\nCmpltTO {nonfatal}\nTOTAL_ERR_NONFATAL {nonfatal}")
        self.write(f"{base}/aer_dev_fatal", f"Undefined 0\nDLP {fatal}\nTOTAL_ERR_FATAL {fatal}")

    def link(
        self, base: str, width: int = 16, max_width: int = 16, speed: str = "16.0", max_speed: str = "16.0"
    ) -> None:
        self.write(f"{base}/current_link_width", width)
        self.write(f"{base}/max_link_width", max_width)
        self.write(f"{base}/current_link_speed", f"{speed} GT/s PCIe")
        self.write(f"{base}/max_link_speed", f"{max_speed} GT/s PCIe")

    def amd_gpu(self, bdf: str = BDF, ue: int = 0, ce: int = 0, correctable: int = 0, fatal: int = 0) -> str:
        """An MI210-like amdgpu device with every signal the source reads."""
        base = self.pci(bdf)
        self.aer(base, correctable=correctable, fatal=fatal)
        self.link(base)
        h = f"{base}/hwmon/hwmon3"
        self.write(f"{h}/name", "amdgpu")
        for n, (label, value, crit, top) in enumerate(
            (("edge", 45000, 100000, None), ("junction", 52000, 110000, 105000), ("mem", 48000, 100000, 95000)),
            start=1,
        ):
            self.write(f"{h}/temp{n}_label", label)
            self.write(f"{h}/temp{n}_input", value)
            self.write(f"{h}/temp{n}_crit", crit)
            self.write(f"{h}/temp{n}_emergency", crit + 5000)
            if top is not None:
                self.write(f"{h}/temp{n}_max", top)
        self.write(f"{h}/fan1_input", 1200)
        self.write(f"{h}/fan1_min", 300)
        self.write(f"{h}/fan1_max", 3000)
        self.write(f"{h}/power1_average", 250_000_000)
        self.write(f"{h}/power1_cap", 300_000_000)
        self.write(f"{h}/energy1_input", 123_456_789_000)
        self.write(f"{h}/in0_label", "vddgfx")
        self.write(f"{h}/in0_input", 806)
        self.write(f"{h}/in0_min", 700)
        self.write(f"{h}/in0_max", 1100)
        self.write(f"{base}/gpu_busy_percent", 37)
        self.write(f"{base}/mem_info_vram_used", 16 << 30)
        self.write(f"{base}/mem_info_vram_total", 64 << 30)
        self.write(f"{base}/vbios_version", "113-D67301-063")
        self.write(f"{base}/serial_number", "692124000123")
        self.ras(base, ue=ue, ce=ce)
        return base

    def ras(self, base: str, ue: int = 0, ce: int = 0) -> None:
        self.write(f"{base}/ras/umc_err_count", f"ue: {ue}\nce: {ce}")
        self.write(f"{base}/ras/gfx_err_count", "ue: 0\nce: 1")

    def nic(self, iface: str = "eth0", rx_errors: int = 2, tx_errors: int = 1) -> str:
        base = f"class/net/{iface}"
        self.write(f"{base}/carrier", 1)
        self.write(f"{base}/statistics/rx_errors", rx_errors)
        self.write(f"{base}/statistics/tx_errors", tx_errors)
        self.write(f"{base}/statistics/rx_bytes", 10**9)
        self.write(f"{base}/device/vendor", "0x8086")
        self.write(f"{base}/device/device", "0x1593")
        self.write(f"{base}/device/class", "0x020000")
        self.aer(f"{base}/device", correctable=4)
        self.link(f"{base}/device", width=8, max_width=8, speed="8.0", max_speed="8.0")
        return base

    def virtual_nic(self, iface: str) -> None:
        self.write(f"class/net/{iface}/carrier", 1)
        self.write(f"class/net/{iface}/statistics/rx_errors", 0)


def value(src: SysfsSource, frame: Frame, hw_id: str, metric: str, sensor: str | None = None, **attrs: str) -> float:
    """The frame's value for one column of one device (NaN when the column was never seen)."""
    kind = {"temp": "temperature", "fan": "fan", "volt": "voltage"}[sensor.split("/")[0]] if sensor else None
    column = Column(metric, attrs_of({k.replace("__", "."): v for k, v in attrs.items()}), sensor, kind)
    index = {c: i for i, c in enumerate(src.schema.columns)}.get(column)
    if index is None or index >= frame.values.shape[1]:
        return math.nan
    return float(frame.values[frame.devices.ids.index(hw_id), index])


LINK = {"error__type": "link"}


@pytest.fixture
def amd() -> tuple[SysfsSource, Frame]:
    src = SysfsSource("node-a", root=str(DATA))
    return src, src.read(T0)


def test_committed_tree_identity(amd: tuple[SysfsSource, Frame]) -> None:
    _, frame = amd
    assert frame.devices.ids == (BDF, "eth0")
    gpu, nic = frame.devices.attrs
    assert gpu[cv.HW_TYPE] == "gpu" and gpu[cv.HW_VENDOR] == "AMD" and gpu[cv.HW_MODEL] == "0x740f"
    assert gpu[cv.HW_FIRMWARE_VERSION] == "113-D67301-063" and gpu[cv.HW_SERIAL_NUMBER] == "692124000123"
    assert gpu[cv.DRA_POOL_NAME] == "node-a" and gpu[cv.DRA_DEVICE_NAME] == "0000-03-00-0"
    assert cv.DRA_DRIVER_NAME not in gpu and cv.DRA_DRIVER_NAME not in nic
    assert nic[cv.HW_TYPE] == "network" and nic[cv.HW_VENDOR] == "Intel" and nic[cv.DRA_DEVICE_NAME] == "eth0"
    probe = SysfsSource.probe(_config(DATA))
    assert (probe.found, probe.others) == (1, 1)
    assert probe.why == f"sysfs shows 1 PCI accelerator(s) ['{BDF}'] and 1 physical NIC(s) ['eth0'] under {DATA}"


def test_committed_tree_temperatures(amd: tuple[SysfsSource, Frame]) -> None:
    src, f = amd
    t, tl = cv.HW_TEMPERATURE.name, cv.HW_TEMPERATURE_LIMIT.name
    loc = "hw__sensor_location"
    assert value(src, f, BDF, t, "temp/edge", **{loc: "edge"}) == pytest.approx(45.0)
    assert value(src, f, BDF, t, "temp/junction", **{loc: "junction"}) == pytest.approx(52.0)
    assert value(src, f, BDF, t, "temp/mem", **{loc: "mem"}) == pytest.approx(48.0)
    crit = {loc: "junction", "hw__limit_type": "high.critical"}
    assert value(src, f, BDF, tl, "temp/junction", **crit) == pytest.approx(110.0)  # _crit wins over _emergency
    deg = {loc: "junction", "hw__limit_type": "high.degraded"}
    assert value(src, f, BDF, tl, "temp/junction", **deg) == pytest.approx(105.0)
    assert math.isnan(value(src, f, BDF, tl, "temp/edge", **{loc: "edge", "hw__limit_type": "high.degraded"}))


def test_committed_tree_fan_power_energy_voltage(amd: tuple[SysfsSource, Frame]) -> None:
    src, f = amd
    assert value(src, f, BDF, cv.HW_FAN_SPEED.name, "fan/1") == 1200
    assert value(src, f, BDF, cv.HW_FAN_SPEED_RATIO.name, "fan/1") == pytest.approx(0.4)
    low = {"hw__limit_type": "low.critical"}
    assert value(src, f, BDF, cv.HW_FAN_SPEED_LIMIT.name, "fan/1", **low) == 300
    assert value(src, f, BDF, cv.HW_FAN_SPEED_LIMIT.name, "fan/1", hw__limit_type="max") == 3000
    assert value(src, f, BDF, cv.HW_POWER.name) == pytest.approx(250.0)
    assert value(src, f, BDF, cv.HW_POWER_LIMIT.name, hw__limit_type="max") == pytest.approx(300.0)
    assert value(src, f, BDF, cv.HW_ENERGY.name) == pytest.approx(123_456.789)
    assert value(src, f, BDF, cv.HW_VOLTAGE.name, "volt/vddgfx") == pytest.approx(0.806)
    vl = cv.HW_VOLTAGE_LIMIT.name
    assert value(src, f, BDF, vl, "volt/vddgfx", hw__limit_type="low.critical") == pytest.approx(0.7)
    assert value(src, f, BDF, vl, "volt/vddgfx", hw__limit_type="high.critical") == pytest.approx(1.1)


def test_committed_tree_amdgpu_and_pci(amd: tuple[SysfsSource, Frame]) -> None:
    src, f = amd
    assert value(src, f, BDF, cv.HW_GPU_UTILIZATION.name, hw__gpu__task="general") == pytest.approx(0.37)
    assert value(src, f, BDF, cv.HW_GPU_MEMORY_USAGE.name) == 16 << 30
    assert value(src, f, BDF, cv.HW_GPU_MEMORY_LIMIT.name) == 64 << 30
    assert value(src, f, BDF, cv.HW_GPU_MEMORY_UTILIZATION.name) == pytest.approx(0.25)
    e = cv.HW_ERRORS.name
    assert value(src, f, BDF, e, error__type="uncorrected") == 0  # umc 0 + gfx 0
    assert value(src, f, BDF, e, error__type="corrected") == 3  # umc 2 + gfx 1
    assert value(src, f, BDF, e, **LINK, hw__link__type="pcie") == 5
    assert value(src, f, BDF, e, **LINK, hw__link__type="pcie", hw__error__code="TOTAL_ERR_NONFATAL") == 0
    assert value(src, f, BDF, e, **LINK, hw__link__type="pcie", hw__error__code="TOTAL_ERR_FATAL") == 1
    assert value(src, f, BDF, cv.HW_PCIE_LINK_WIDTH.name) == 8  # trained down from x16
    assert value(src, f, BDF, cv.HW_PCIE_LINK_WIDTH_LIMIT.name, hw__limit_type="max") == 16
    assert value(src, f, BDF, cv.HW_PCIE_LINK_GENERATION.name) == 4
    assert value(src, f, BDF, cv.HW_PCIE_LINK_GENERATION_LIMIT.name, hw__limit_type="max") == 4


def test_committed_tree_nic(amd: tuple[SysfsSource, Frame]) -> None:
    src, f = amd
    assert value(src, f, "eth0", cv.HW_ERRORS.name, **LINK, hw__link__type="other") == 3  # rx 2 + tx 1
    assert value(src, f, "eth0", cv.HW_ERRORS.name, **LINK, hw__link__type="pcie") == 4  # its PCI function's AER
    assert value(src, f, "eth0", cv.HW_PCIE_LINK_GENERATION.name) == 3
    assert math.isnan(value(src, f, "eth0", cv.HW_TEMPERATURE.name))  # a NIC without hwmon: NaN, not 0
    assert cv.HW_GPU_IO.name not in {c.metric for c in src.schema.columns}  # bytes left out


@pytest.mark.parametrize(("speed", "gen"), [("2.5", 1), ("5.0", 2), ("8.0", 3), ("16.0", 4), ("32.0", 5), ("64.0", 6)])
def test_link_generation(speed: str, gen: int) -> None:
    assert link_generation(f"{speed} GT/s PCIe") == gen


def test_link_generation_unknown() -> None:
    assert math.isnan(link_generation("Unknown")) and math.isnan(link_generation(None))


def test_dns_label() -> None:
    assert dns_label("0000:C3:00.0") == "0000-c3-00-0"
    assert dns_label("eth0.100") == "eth0-100"
    assert len(dns_label("x" * 80)) == 63


def test_discovery_skips_lo_virtual_and_non_accelerators(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    fake.amd_gpu()
    fake.pci("0000:00:1f.6", vendor="0x8086", device="0x15bb", klass="0x020000")  # a NIC function, not a GPU
    fake.pci("0000:02:00.0", vendor="0x1a03", device="0x2000", klass="0x030000")  # a BMC's VGA
    fake.pci("0000:41:00.0", vendor="0x1e52", device="0x1001", klass="0x120000")  # an accelerator, any vendor
    fake.virtual_nic("lo")
    fake.virtual_nic("docker0")
    fake.nic("ens1")
    src = SysfsSource("n", root=str(tmp_path))
    frame = src.read(T0)
    assert frame.devices.ids == (BDF, "0000:41:00.0", "ens1")
    assert cv.HW_VENDOR not in frame.devices.attrs[1]  # unknown vendor id: left out
    assert SysfsSource.probe(_config(tmp_path)).found == 2  # what read() found, by the same rule
    assert SysfsSource.probe(_config(tmp_path / "nothing")).found == 0


def test_missing_optional_files_leave_nan(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    base = fake.pci(BDF)
    fake.write(f"{base}/hwmon/hwmon0/temp1_input", 61000)  # no label, no limits, nothing else
    src = SysfsSource("n", root=str(tmp_path))
    frame = src.read(T0)
    assert value(src, frame, BDF, cv.HW_TEMPERATURE.name, "temp/1") == pytest.approx(61.0)
    assert np.isnan(frame.values).sum() == frame.values.size - 1
    assert sorted(c.metric for c in src.schema.columns) == [cv.HW_TEMPERATURE.name]


def test_power_input_when_no_average(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    base = fake.pci(BDF, vendor="0x8086", device="0x56c0")
    fake.write(f"{base}/hwmon/hwmon1/power1_input", 75_500_000)
    src = SysfsSource("n", root=str(tmp_path))
    f = src.read(T0)
    assert value(src, f, BDF, cv.HW_POWER.name) == pytest.approx(75.5)
    assert f.devices.attrs[0][cv.HW_VENDOR] == "Intel"


def test_device_that_disappears_gets_nan_while_the_other_reports(tmp_path: Path) -> None:
    shutil.copytree(DATA, tmp_path / "sys")
    fake = FakeSysfs(tmp_path / "sys")
    fake.amd_gpu("0000:83:00.0")
    src = SysfsSource("n", root=str(tmp_path / "sys"))
    first = src.read(T0)
    assert first.devices.ids == (BDF, "0000:83:00.0", "eth0")
    assert not np.isnan(first.values).all(axis=1).any()
    shutil.rmtree(tmp_path / "sys" / "bus" / "pci" / "devices" / BDF)
    second = src.read(T0 + 10 * S)
    assert second.devices.ids == first.devices.ids  # still known: the classifier decides device_lost
    assert np.isnan(second.values[0]).all()
    assert value(src, second, "0000:83:00.0", cv.HW_POWER.name) == pytest.approx(250.0)
    assert value(src, second, "eth0", cv.HW_ERRORS.name, **LINK, hw__link__type="other") == 3


def test_unreadable_device_gets_nan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO on one device's file (a GPU fallen off the bus) blanks that device only."""
    fake = FakeSysfs(tmp_path)
    fake.amd_gpu()
    fake.amd_gpu("0000:83:00.0")
    src = SysfsSource("n", root=str(tmp_path))
    src.read(T0)
    real = Path.read_text

    def flaky(self: Path, *args: object, **kwargs: object) -> str:
        if BDF in str(self) and self.name == "gpu_busy_percent":
            raise OSError(5, "Input/output error")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", flaky)
    frame = src.read(T0 + 10 * S)
    assert np.isnan(frame.values[0]).all()
    assert not np.isnan(frame.values[1]).all()


def test_real_sys_class_net() -> None:
    """This machine's /sys: lo and virtual interfaces are skipped, any real NIC has sane numbers."""
    if not Path("/sys/class/net").is_dir():
        pytest.skip("no /sys/class/net here")
    src = SysfsSource("real", root="/sys")
    frame = src.read(T0)
    src.close()
    assert "lo" not in frame.devices.ids
    errors = Column(cv.HW_ERRORS.name, attrs_of({cv.ERROR_TYPE_ATTR: "link", cv.HW_LINK_TYPE: "other"}))
    for row, (hw_id, attrs) in enumerate(zip(frame.devices.ids, frame.devices.attrs, strict=True)):
        assert attrs[cv.DRA_DEVICE_NAME] == dns_label(hw_id)
        if attrs[cv.HW_TYPE] == "network":
            assert (Path("/sys/class/net") / hw_id / "device").exists()
            count = frame.values[row, src.schema.index(errors)]
            assert count >= 0 and math.isfinite(count)
    probe = SysfsSource.probe(_config("/sys"))
    assert probe.found + probe.others == len(frame.devices)


def _classify(tmp_path: Path, change: dict[int, tuple[int, int]]) -> dict[str, list]:
    """Read a four-GPU fake node every 10 s through the real classifier; at step k set GPU 0's
    (RAS ue, AER fatal) to ``change[k]``. Returns the verdicts by device."""
    fake = FakeSysfs(tmp_path)
    base = fake.amd_gpu()
    for bus in ("83", "a3", "c3"):  # quiet peers: the link rule also compares a GPU with the node's others
        fake.amd_gpu(f"0000:{bus}:00.0")
    src = SysfsSource("n1", root=str(tmp_path))
    classifier = Classifier(policy_mod.load(), src.schema, interval_s=10)
    out: dict[str, list] = {}
    for step in range(12):
        if step in change:
            ue, fatal = change[step]
            fake.ras(base, ue=ue)
            fake.aer(base, fatal=fatal)
        now = T0 + step * 10 * S
        classifier.ingest(src.read(now))
        for verdict in classifier.evaluate(now):
            out.setdefault(verdict.hw_id, []).append(verdict)
    return out


def test_classifier_healthy_node(tmp_path: Path) -> None:
    out = _classify(tmp_path, {})
    for hw_id in (BDF, "0000:83:00.0"):
        assert out[hw_id][-1].health == "Healthy", out[hw_id][-1]
        assert out[hw_id][-1].pool == "n1" and out[hw_id][-1].device == dns_label(hw_id)


def test_classifier_ras_uncorrected_fails_the_device(tmp_path: Path) -> None:
    out = _classify(tmp_path, {5: (1, 0)})
    last = out[BDF][-1]
    assert last.health == "Unhealthy" and "memory_ecc" in last.reasons, last
    assert out["0000:83:00.0"][-1].health == "Healthy"


def test_classifier_device_lost(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    fake.amd_gpu()
    fake.amd_gpu("0000:83:00.0")
    src = SysfsSource("n1", root=str(tmp_path))
    classifier = Classifier(policy_mod.load(), src.schema, interval_s=10)
    verdicts: list = []
    for step in range(20):
        if step == 3:
            shutil.rmtree(tmp_path / "bus" / "pci" / "devices" / BDF)
        now = T0 + step * 10 * S
        classifier.ingest(src.read(now))
        verdicts += classifier.evaluate(now)
    lost = [v for v in verdicts if v.hw_id == BDF][-1]
    assert lost.health == "Unhealthy" and "device_lost" in lost.reasons, lost
    assert [v for v in verdicts if v.hw_id == "0000:83:00.0"][-1].health == "Healthy"


def test_classifier_aer_uncorrectable_burst_is_a_link_fault(tmp_path: Path) -> None:
    """AER fatal counts feed the link rule (with the other PCIe link errors); a burst degrades the GPU."""
    out = _classify(tmp_path, {5: (0, 500)})
    last = out[BDF][-1]
    assert last.state == "degraded" and "link" in last.reasons, last
    assert out["0000:83:00.0"][-1].reasons == ()


# -- amdgpu throttle causes from gpu_metrics ------------------------------------------------------------
# The tables as the kernel declares them (drivers/gpu/drm/amd/include/kgd_pp_interface.h; ctypes lays
# them out as the C compiler does), to write gpu_metrics files byte for byte as amdgpu does.
_u8, _u16, _u32, _u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
_HEADER = [("structure_size", _u16), ("format_revision", _u8), ("content_revision", _u8)]


class GpuMetricsV13(ctypes.Structure):
    """struct gpu_metrics_v1_3 (MI100, MI200, RDNA2/3 dGPUs)."""

    _fields_ = [
        *_HEADER,
        *[(f"temperature_{n}", _u16) for n in ("edge", "hotspot", "mem", "vrgfx", "vrsoc", "vrmem")],
        *[(f"average_{n}_activity", _u16) for n in ("gfx", "umc", "mm")],
        ("average_socket_power", _u16),
        ("energy_accumulator", _u64),
        ("system_clock_counter", _u64),
        *[(f"average_{n}_frequency", _u16) for n in ("gfxclk", "socclk", "uclk", "vclk0", "dclk0", "vclk1", "dclk1")],
        *[(f"current_{n}", _u16) for n in ("gfxclk", "socclk", "uclk", "vclk0", "dclk0", "vclk1", "dclk1")],
        ("throttle_status", _u32),
        ("current_fan_speed", _u16),
        ("pcie_link_width", _u16),
        ("pcie_link_speed", _u16),
        ("padding", _u16),
        ("gfx_activity_acc", _u32),
        ("mem_activity_acc", _u32),
        ("temperature_hbm", _u16 * 4),
        ("firmware_timestamp", _u64),
        ("voltage_soc", _u16),
        ("voltage_gfx", _u16),
        ("voltage_mem", _u16),
        ("padding1", _u16),
        ("indep_throttle_status", _u64),
    ]


class XcpMetricsV12(ctypes.Structure):
    """struct amdgpu_xcp_metrics_v1_2."""

    _fields_ = [
        ("gfx_busy_inst", _u32 * 8),
        ("jpeg_busy", _u16 * 40),
        ("vcn_busy", _u16 * 4),
        ("gfx_busy_acc", _u64 * 8),
        ("gfx_below_host_limit_ppt_acc", _u64 * 8),
        ("gfx_below_host_limit_thm_acc", _u64 * 8),
        ("gfx_low_utilization_acc", _u64 * 8),
        ("gfx_below_host_limit_total_acc", _u64 * 8),
    ]


class GpuMetricsV18(ctypes.Structure):
    """struct gpu_metrics_v1_8 (MI300 series)."""

    _fields_ = [
        *_HEADER,
        ("temperature_hotspot", _u16),
        ("temperature_mem", _u16),
        ("temperature_vrsoc", _u16),
        ("curr_socket_power", _u16),
        ("average_gfx_activity", _u16),
        ("average_umc_activity", _u16),
        ("mem_max_bandwidth", _u64),
        ("energy_accumulator", _u64),
        ("system_clock_counter", _u64),
        ("accumulation_counter", _u32),
        ("prochot_residency_acc", _u32),
        ("ppt_residency_acc", _u32),
        ("socket_thm_residency_acc", _u32),
        ("vr_thm_residency_acc", _u32),
        ("hbm_thm_residency_acc", _u32),
        ("gfxclk_lock_status", _u32),
        ("pcie_link_width", _u16),
        ("pcie_link_speed", _u16),
        ("xgmi_link_width", _u16),
        ("xgmi_link_speed", _u16),
        ("gfx_activity_acc", _u32),
        ("mem_activity_acc", _u32),
        ("pcie_bandwidth_acc", _u64),
        ("pcie_bandwidth_inst", _u64),
        ("pcie_l0_to_recov_count_acc", _u64),
        ("pcie_replay_count_acc", _u64),
        ("pcie_replay_rover_count_acc", _u64),
        ("pcie_nak_sent_count_acc", _u32),
        ("pcie_nak_rcvd_count_acc", _u32),
        ("xgmi_read_data_acc", _u64 * 8),
        ("xgmi_write_data_acc", _u64 * 8),
        ("xgmi_link_status", _u16 * 8),
        ("padding", _u16),
        ("firmware_timestamp", _u64),
        ("current_gfxclk", _u16 * 8),
        ("current_socclk", _u16 * 4),
        ("current_vclk0", _u16 * 4),
        ("current_dclk0", _u16 * 4),
        ("current_uclk", _u16),
        ("num_partition", _u16),
        ("xcp_stats", XcpMetricsV12 * 8),
        ("pcie_lc_perf_other_end_recovery", _u32),
    ]


# SMU_THROTTLER_*_BIT of amdgpu_smu.h, as recorded data.
PPT0, TEMP_HOTSPOT, TEMP_VR_GFX, VRHOT0, FIT = 0, 36, 38, 44, 57
THROTTLE_REASONS_AMD = ("thermal", "power_cap", "hw_slowdown", "other")
THROTTLE_REASONS = ("thermal", "power", "power_cap", "power_brake", "hw_slowdown", "other")  # the contract's


def v13(indep_throttle_status: int) -> bytes:
    """An MI210's gpu_metrics (v1.3) with these throttlers active."""
    m = GpuMetricsV13(structure_size=ctypes.sizeof(GpuMetricsV13), format_revision=1, content_revision=3)
    m.temperature_edge, m.temperature_hotspot, m.average_socket_power = 45, 52, 250
    m.indep_throttle_status = indep_throttle_status
    return bytes(m)


def v18(counter: int, prochot: int, ppt: int, socket_thm: int, vr_thm: int, hbm_thm: int) -> bytes:
    """An MI300X's gpu_metrics (v1.8) with these accumulators."""
    m = GpuMetricsV18(structure_size=ctypes.sizeof(GpuMetricsV18), format_revision=1, content_revision=8)
    m.temperature_hotspot, m.curr_socket_power, m.num_partition = 61, 690, 1
    m.accumulation_counter, m.prochot_residency_acc, m.ppt_residency_acc = counter, prochot, ppt
    m.socket_thm_residency_acc, m.vr_thm_residency_acc, m.hbm_thm_residency_acc = socket_thm, vr_thm, hbm_thm
    return bytes(m)


def throttle(src: SysfsSource, frame: Frame, hw_id: str = BDF) -> dict[str, float]:
    return {r: value(src, frame, hw_id, cv.HW_THROTTLE_TIME.name, hw__throttle__reason=r) for r in THROTTLE_REASONS}


def test_gpu_metrics_layouts_are_the_kernel_s() -> None:
    """ctypes lays the structs out as gcc does the kernel's (sizes and offsets gcc printed for
    kgd_pp_interface.h on x86-64), which are the offsets the source reads."""
    assert ctypes.sizeof(GpuMetricsV13) == 120 and GpuMetricsV13.indep_throttle_status.offset == 112
    assert ctypes.sizeof(GpuMetricsV18) == 3872 and GpuMetricsV18.accumulation_counter.offset == 40
    assert GpuMetricsV18.hbm_thm_residency_acc.offset == 60
    committed = (DATA / "bus/pci/devices" / BDF / "gpu_metrics").read_bytes()
    m = GpuMetricsV13.from_buffer_copy(committed)
    assert (m.structure_size, m.format_revision, m.content_revision) == (120, 1, 3) and len(committed) == 120
    assert m.indep_throttle_status == 1 << PPT0 and m.average_socket_power == 250


def test_committed_tree_throttle_baseline(amd: tuple[SysfsSource, Frame]) -> None:
    src, frame = amd
    t = throttle(src, frame)
    assert {r: t[r] for r in THROTTLE_REASONS_AMD} == dict.fromkeys(THROTTLE_REASONS_AMD, 0.0)
    assert math.isnan(t["power_brake"]) and math.isnan(t["power"])  # amdgpu has no brake signal


def test_v13_throttlers_are_sampled_into_time_by_reason(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(DATA, root)
    metrics = root / "bus/pci/devices" / BDF / "gpu_metrics"
    src = SysfsSource("node-a", root=str(root))
    # (throttlers active at the pass, then thermal, power_cap, hw_slowdown, other so far): the throttlers
    # seen at one pass are credited with the 10 s to the next.
    passes = [
        ({PPT0}, 0, 0, 0, 0),
        ({PPT0, TEMP_HOTSPOT}, 0, 10, 0, 0),
        ({VRHOT0, TEMP_VR_GFX}, 10, 20, 0, 0),
        ({FIT}, 20, 20, 10, 0),
        (set(), 20, 20, 10, 10),
        (set(), 20, 20, 10, 10),
    ]
    for k, (bits, *expected) in enumerate(passes):
        metrics.write_bytes(v13(sum(1 << b for b in bits)))
        t = throttle(src, src.read(T0 + 10 * k * S))
        assert [t[r] for r in THROTTLE_REASONS_AMD] == pytest.approx(expected), k
    metrics.unlink()  # a pass without the table: nothing reported, the next one is a new baseline
    assert math.isnan(throttle(src, src.read(T0 + 60 * S))["power_cap"])
    metrics.write_bytes(v13(1 << PPT0))
    assert throttle(src, src.read(T0 + 70 * S))["power_cap"] == 20
    assert throttle(src, src.read(T0 + 80 * S))["power_cap"] == 30


def test_v18_residency_accumulators_give_each_reason_its_share(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    base = fs.amd_gpu()
    fs.write(f"{base}/device", "0x74a1")  # MI300X
    metrics = tmp_path / base / "gpu_metrics"
    src = SysfsSource("node-a", root=str(tmp_path))
    wrap = 1 << 32
    # (counter, prochot, ppt, socket_thm, vr_thm, hbm_thm), then power_cap, thermal, hw_slowdown so far
    passes = [
        ((wrap - 296, 10, wrap - 296, 5, 0, 7), 0, 0, 0),
        ((704, 10, 304, 55, 0, 207), 6, 2, 0),  # both u32 wrapped: 1000 cycles, PPT 600, HBM 20% (SOCKET 5%)
        ((1704, 110, 804, 55, 100, 257), 11, 3, 1),  # PPT 50%, VR 10% (HBM 5%), PROCHOT 10%
        ((1704, 110, 804, 55, 100, 257), 11, 3, 1),  # the firmware did not accumulate: nothing credited
        ((50, 0, 0, 0, 0, 0), 11, 3, 1),  # reset: a new baseline, never a negative share
        ((1050, 0, 1000, 0, 0, 0), 21, 3, 1),
    ]
    for k, (acc, *expected) in enumerate(passes):
        metrics.write_bytes(v18(*acc))
        t = throttle(src, src.read(T0 + 10 * k * S))
        assert [t["power_cap"], t["thermal"], t["hw_slowdown"]] == pytest.approx(expected), k
        assert math.isnan(t["other"]) and math.isnan(t["power_brake"])


def test_gpu_metrics_versions_not_read_report_no_throttle(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    base = fs.amd_gpu()
    src = SysfsSource("node-a", root=str(tmp_path))
    m = GpuMetricsV13(structure_size=ctypes.sizeof(GpuMetricsV13), format_revision=1, content_revision=2)
    for data in (b"", b"\x78\x00\x01", bytes(m), v13(1)[:100]):  # empty, torn header, v1.2, short v1.3
        (tmp_path / base / "gpu_metrics").write_bytes(data)
        t = throttle(src, src.read(T0))
        assert all(math.isnan(v) for v in t.values()), data[:4]
