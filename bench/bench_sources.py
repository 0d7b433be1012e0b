"""One sampling pass over 8 devices, per source: NVML (against the tests' fake NVML), sysfs (a fake
tree of 8 GPUs copied from tests/data/sysfs-amd), and the simulator as the baseline in the same run.

Run ``.venv/bin/python bench/bench_sources.py``; figures go to the terminal and to ``BENCHMARKS.md``
(between the ``bench_sources`` markers). A benchmark, not a test. With a real GPU, the latency of a
real NVML pass is what ``tests/gpu/test_nvml_real.py`` prints.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _report  # noqa: E402
from otel_dra.sources.nvml import NvmlSource  # noqa: E402
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig  # noqa: E402
from otel_dra.sources.sysfs import SysfsSource  # noqa: E402
from tests.support.fake_nvml import FakeGpu, FakeNvml  # noqa: E402

BENCHMARKS_MD = _report.BENCHMARKS_MD
START, END = "<!-- bench_sources:start -->", "<!-- bench_sources:end -->"
TREE = ROOT / "tests" / "data" / "sysfs-amd"
DEVICES = 8


def passes(read: Callable[[int], object], n: int = 200) -> float:
    """Median seconds of one ``read``."""
    read(time.time_ns())  # first pass builds the device table and columns
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        read(time.time_ns())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sysfs_tree(into: Path) -> Path:
    """The committed AMD GPU copied to 8 PCI addresses (no NICs)."""
    gpu = TREE / "bus" / "pci" / "devices" / "0000:03:00.0"
    for i in range(DEVICES):
        shutil.copytree(gpu, into / "bus" / "pci" / "devices" / f"0000:{0x10 + i:02x}:00.0", symlinks=True)
    (into / "class" / "net").mkdir(parents=True)
    return into


def main() -> None:
    sim = SimulatedSource(SimulatorConfig("bench", devices=DEVICES, seed=1))
    nvml = NvmlSource("bench", nvml=FakeNvml([FakeGpu(uuid=f"GPU-{i:08d}-bench") for i in range(DEVICES)]))
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = SysfsSource("bench", str(sysfs_tree(Path(tmp))))
        figures = {
            "simulated": passes(sim.read),
            "nvml (fake)": passes(nvml.read),
            "sysfs (fake tree)": passes(sysfs.read),
        }
        sysfs_devices = len(sysfs.read(time.time_ns()).devices)
    nvml.close()
    if sysfs_devices != DEVICES:
        raise AssertionError(f"the fake sysfs tree has {sysfs_devices} devices, not {DEVICES}")
    base = figures["simulated"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        f"| {name} | {1e3 * s:.2f} ms | {1e6 * s / DEVICES:.0f} µs | x{s / base:.1f} |" for name, s in figures.items()
    ]
    section = (
        "\n".join(
            [
                START,
                "## One sampling pass over 8 devices, per source (`bench/bench_sources.py`)",
                "",
                f"Measured {now} on {os.cpu_count()} CPUs, Python {platform.python_version()}. Median of 200 passes.",
                "",
                "| source | one pass | per device | vs the simulator (same run) |",
                "|---|---|---|---|",
                *rows,
                "",
                "- nvml runs against the tests' fake NVML module (the real library's API surface and errors): it "
                "measures our side of a pass, not the driver's; no GPU machine was lent to measure a real one "
                "(`tests/gpu/test_nvml_real.py` prints it where one is). sysfs reads a fake tree of 8 amdgpu devices "
                "with hwmon, AER, RAS and link files from a temporary directory.",
                "",
                "Reproduce: `.venv/bin/python bench/bench_sources.py`.",
                END,
            ]
        )
        + "\n"
    )
    print("\n".join(rows))
    _report.write_section(START, END, section, BENCHMARKS_MD)


if __name__ == "__main__":
    main()
