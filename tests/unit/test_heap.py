"""The heap trimmer, on this machine's real glibc: memory freed inside the heap goes back to the system after a
tick, only when there is enough of it, and trims take at most their share of the time."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otel_dra import policy
from otel_dra.component import ConfigError
from otel_dra.config import FleetConfig
from otel_dra.fleet import Fleet
from otel_dra.heap import (
    MMAP_THRESHOLD_MAX,
    HeapTrimConfig,
    HeapTrimmer,
    HeapUse,
    _glibc,
    numpy_small_pages,
    thresholds_chosen,
)
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import EndpointConfig
from tests.conftest import wait_for
from tests.support.helpers import freed_inside_the_heap, resident_bytes

pytestmark = pytest.mark.skipif(_glibc() is None, reason="the C library has no mallinfo2/malloc_trim (not glibc)")


#: A fresh interpreter's heap, not a worker's that earlier tests left (free room, a fleet's threads that may still be
#: in a tick, with glibc's mmap threshold lowered for it): there it gave back 66 MiB of the 192 once, under a new
#: placement of the modules on the workers (cause not pinned down). The 192 MiB freed inside the heap, and what the
#: trim after a tick gives back.
_FREED_AND_TRIMMED = """
from otel_dra.heap import HeapTrimConfig, HeapTrimmer
from tests.support.helpers import freed_inside_the_heap, resident_bytes
trimmer = HeapTrimmer(HeapTrimConfig())
trimmer.start()
kept = freed_inside_the_heap()
before = resident_bytes()
trimmed = trimmer.after_tick(monotonic=1000.0)
print(int(trimmed), before - resident_bytes(), trimmer.trims, int(trimmer.seconds > 0), kept[0][0])
"""


def test_memory_freed_inside_the_heap_goes_back_after_a_tick():
    root = Path(__file__).parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _FREED_AND_TRIMMED], capture_output=True, text=True, check=True, timeout=60, cwd=root
    )
    trimmed, given_back, trims, timed, kept = map(int, out.stdout.split())
    assert trimmed == 1 and trims == 1 and timed == 1
    assert given_back > 128 << 20, "most of the 192 MiB freed should have left the resident set"
    assert kept == 2


def test_nothing_is_trimmed_while_the_heap_holds_little_free():
    trimmer = HeapTrimmer(HeapTrimConfig(min_free_bytes=1 << 40))
    freed_inside_the_heap(32 << 20)
    before = resident_bytes()
    assert not trimmer.after_tick(monotonic=1000.0)
    assert trimmer.trims == 0
    assert resident_bytes() > before - (16 << 20)  # (what the interpreter itself frees meanwhile aside)


def test_the_free_share_of_what_is_in_use_decides_too():
    due = HeapTrimmer(HeapTrimConfig(min_free_bytes=1 << 20, min_free_share=0.1)).due
    assert due(HeapUse(in_use=100 << 20, free=11 << 20))
    assert not due(HeapUse(in_use=100 << 20, free=9 << 20))  # (a tenth of what is in use: soon reused)
    assert not due(HeapUse(in_use=1 << 20, free=1 << 19))  # (under the floor)


def test_a_trim_waits_until_its_cost_is_a_small_share_of_the_time_since():
    trimmer = HeapTrimmer(HeapTrimConfig(min_free_bytes=0, min_free_share=0.0, max_time_share=0.01))
    assert trimmer.after_tick(monotonic=1000.0)
    wait = trimmer.seconds / 0.01
    assert not trimmer.after_tick(monotonic=1000.0 + wait * 0.9)
    assert trimmer.after_tick(monotonic=1000.0 + wait * 1.1)
    assert trimmer.trims == 2


def test_off_it_never_calls_the_c_library():
    trimmer = HeapTrimmer(HeapTrimConfig(enabled=False, min_free_bytes=0, min_free_share=0.0))
    trimmer.start()
    assert not trimmer.after_tick(monotonic=1000.0)
    assert trimmer.seconds == 0.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_free_bytes", -1, "HeapTrimConfig.min_free_bytes must not be negative, got -1"),
        ("min_free_share", float("nan"), "HeapTrimConfig.min_free_share must not be negative, got nan"),
        ("max_time_share", 0.0, "HeapTrimConfig.max_time_share must be in (0, 1], got 0.0"),
        ("tick_mmap_threshold", -1, f"HeapTrimConfig.tick_mmap_threshold must be in [0, {MMAP_THRESHOLD_MAX}] bytes"),
        ("tick_mmap_threshold", 64 << 20, "HeapTrimConfig.tick_mmap_threshold must be in .* got 67108864"),
    ],
)
def test_a_bad_setting_is_named(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        HeapTrimConfig(**{field: value})


#: A fresh interpreter's heap (none of the free room other tests leave: glibc fills free room, and the heap's top,
#: before it maps a block apart): the bytes mapped apart for a 2 MiB array between ticks (kept), then one during a
#: tick, and what is left mapped after that one is freed. (glibc's own threshold starts at 128 kB: the first array
#: would be mapped apart, and the tick's too.)
_TICK_PAGES = """
import numpy as np
from otel_dra.heap import HeapTrimConfig, HeapTrimmer, _glibc
use = _glibc().use
trimmer = HeapTrimmer(HeapTrimConfig())
trimmer.start()
size = 2 << 20
before = use().mapped
buffer = np.ones(size // 8)
between = use().mapped - before
with trimmer.tick():
    before = use().mapped
    array = np.ones(size // 8)
    during = use().mapped - before
    del array
    freed = use().mapped - before
print(between, during, freed)
"""


@pytest.mark.skipif(thresholds_chosen(), reason="this run's environment sets glibc's thresholds")
def test_a_ticks_large_arrays_have_pages_of_their_own_and_the_receivers_the_heap():
    out = subprocess.run([sys.executable, "-c", _TICK_PAGES], capture_output=True, text=True, check=True, timeout=60)
    between, during, freed = map(int, out.stdout.split())
    assert between < 2 << 20, "between ticks a receiver's 2 MiB buffer should come from the heap"
    assert during >= 2 << 20, "a tick's large array should be a mapped block of its own"
    assert freed < 2 << 20, "freed, its pages should go back to the system at once"


def test_thresholds_the_environment_sets_are_left_alone(monkeypatch, caplog):
    assert thresholds_chosen({"MALLOC_MMAP_THRESHOLD_": "131072"})
    assert thresholds_chosen({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert thresholds_chosen({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"})
    assert not thresholds_chosen({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert not thresholds_chosen({})
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    with caplog.at_level(logging.INFO, logger="otel_dra.heap"):
        HeapTrimmer(HeapTrimConfig()).start()
    assert "thresholds left as the environment sets them" in caplog.text


def test_the_running_fleet_trims_after_its_ticks():
    config = FleetConfig(
        receiver=ReceiverConfig(grpc_port=0, http_port=0),
        endpoint=EndpointConfig(port=0),
        evaluate_every_s=0.05,
        heap=HeapTrimConfig(min_free_bytes=0, min_free_share=0.0, max_time_share=1.0),
    )
    fleet = Fleet(config, policy.load())
    runner = threading.Thread(target=fleet.run)
    runner.start()
    try:
        wait_for(lambda: fleet.heap.trims >= 2 and fleet.ticks >= 2, 10, "two ticks, each followed by a trim", 0.05)
    finally:
        fleet.stop()
        runner.join(10)
    assert fleet.heap.trims >= 2


def test_numpy_is_kept_off_huge_pages_unless_its_own_variable_says():
    from numpy._core import multiarray

    before = multiarray._get_madvise_hugepage()
    try:
        multiarray._set_madvise_hugepage(True)
        assert not numpy_small_pages({"NUMPY_MADVISE_HUGEPAGE": "1"})
        assert multiarray._get_madvise_hugepage()
        assert numpy_small_pages({})
        assert not multiarray._get_madvise_hugepage()
    finally:
        multiarray._set_madvise_hugepage(before)
