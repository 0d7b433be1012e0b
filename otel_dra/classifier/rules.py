"""The rules: each failure reason's evidence, judged for every device at once.

Every rule reads the devices' windows through :class:`Window` (sums and counts kept by the
window store, so reading a window is O(1) per device) and returns, per device, whether its
evidence is present now, the ``hw.state`` it implies, and the ladder step its remediation
starts at. Terms used below, per device over its window (the last ``window`` of samples):

- ``fraction(f)``: share of the window's samples whose indicator ``f`` is 1; 0 when the
  window has fewer than ``min_samples`` samples with ``f`` known (one spike is not a trend);
- ``share(f)``: the increase of a time counter (seconds throttled) over the window's time;
- ``increase(f)``: the counter's increase over the window;
- ``per_minute(f)``: ``increase(f)`` per minute of window time, the time taken as at least a
  minute (``RATE_MIN_SPAN_S``): one corrected error two seconds after a start is one per minute,
  not thirty (a storm of them still counts at once);
- ``events(f, w)``: events of a rare counter within the last ``w`` seconds (event log);
- fleet outlier: above ``median + k x 1.4826 x MAD`` of the same rate over fresh devices.

Rules judge only devices whose telemetry is fresh: a silent device's window is frozen, and
what it means is ``device_lost``'s or ``stale``'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from otel_dra.classifier.features import STATE_CODE, F
from otel_dra.classifier.params import PolicyGroups
from otel_dra.store.events import EventLog
from otel_dra.store.window import WindowStore
from otel_dra.vocabulary import REASONS, REMEDIATIONS

R = {reason: i for i, reason in enumerate(REASONS)}
#: A rate per minute is judged over at least this much time, however young the window.
RATE_MIN_SPAN_S = 60.0
OK, PREDICTED, DEGRADED, FAILED = 0, 1, 2, 3
EVENT_FEATURES = (F.RESETS, F.OUT_OF_MEMORY, F.DRIVER_APPLICATION)


@dataclass
class Window:
    """Read access to the window of every row in ``rows``."""

    store: WindowStore
    events: dict[F, EventLog]
    rows: np.ndarray
    now_s: float
    min_samples: int

    def __post_init__(self) -> None:
        n = self.rows.shape[0]
        # Rows 0..n-1 (every row in use, the usual case) are read as views, not gathered copies.
        at: np.ndarray | slice = slice(0, n) if n and self.rows[-1] == n - 1 else self.rows
        self.sums = self.store.sums[at]
        self.counts = self.store.counts[at]
        self.seconds = self.sums[:, F.DT]
        self.samples = self.counts[:, F.DT]
        self.latest = self.store.latest(at)

    def fraction(self, f: F) -> np.ndarray:
        n = self.counts[:, f]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n >= self.min_samples, self.sums[:, f] / n, 0.0)

    def increase(self, f: F) -> np.ndarray:
        return self.sums[:, f]

    def share(self, f: F) -> np.ndarray:
        ok = (self.samples >= self.min_samples) & (self.seconds > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, self.sums[:, f] / self.seconds, 0.0)

    def per_minute(self, f: F) -> np.ndarray:
        ok = (self.samples >= self.min_samples) & (self.seconds > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, 60.0 * self.sums[:, f] / np.maximum(self.seconds, RATE_MIN_SPAN_S), np.nan)

    def mean(self, f: F) -> np.ndarray:
        n = self.counts[:, f]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.sums[:, f] / n, np.nan)

    def events_since(self, f: F, window_s: np.ndarray) -> np.ndarray:
        return self.events[f].since(self.now_s - window_s, self.rows)


def fleet_outlier(rate: np.ndarray, fresh: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Robust fleet bar for a rate: median + k x 1.4826 x MAD over fresh devices with a rate."""
    pool = rate[fresh & ~np.isnan(rate)]
    if pool.size == 0:
        return np.full(rate.shape, np.inf)
    median = float(np.median(pool))
    mad = float(np.median(np.abs(pool - median)))
    return median + k * 1.4826 * mad


@dataclass
class Evidence:
    """Per (row, reason): evidence present now, the state it implies, the least remediation it needs."""

    present: np.ndarray  # bool (n, R)
    state: np.ndarray  # int8 (n, R)
    floor: np.ndarray  # int8 (n, R): a REMEDIATIONS index the remediation is at least


Rule = Callable[[Window, PolicyGroups, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _state(groups: PolicyGroups, rows: np.ndarray, reason: str, key: str = "state") -> np.ndarray:
    codes = np.asarray([STATE_CODE[rules[reason][key]] for rules in groups.rules], dtype=np.int8)
    return codes[groups.group[rows]]


def thermal(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sustained temperature above the sensor's high.degraded limit, or thermal throttling a
    share of the time; sustained above high.critical takes ``critical_state``."""
    p = g.param
    hot = w.fraction(F.TEMP_HOT) >= p(w.rows, "thermal", "min_fraction")
    throttled = w.share(F.THROTTLE_THERMAL) >= p(w.rows, "thermal", "throttle_share")
    critical = w.fraction(F.TEMP_CRIT) >= p(w.rows, "thermal", "min_fraction")
    state = np.where(critical, _state(g, w.rows, "thermal", "critical_state"), _state(g, w.rows, "thermal"))
    return hot | throttled | critical, state


def cooling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fan near zero (or below its own low limit) while the device is warm, sustained."""
    return w.fraction(F.COOLING_BAD) >= g.param(w.rows, "cooling", "min_fraction"), _state(g, w.rows, "cooling")


def memory_ecc(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uncorrected errors in the window or retired pages at the limit fail the device; retired
    pages near it, or a corrected-error rate that is a fleet outlier, predict failure."""
    p = g.param
    uncorrected = w.increase(F.ECC_UNCORRECTED) >= p(w.rows, "memory_ecc", "uncorrected")
    retired = np.nan_to_num(w.latest[:, F.RETIRED_TOTAL])
    retired_failed = retired >= p(w.rows, "memory_ecc", "retired_pages_failed")
    retired_warn = retired >= p(w.rows, "memory_ecc", "retired_pages_predicted")
    rate = w.per_minute(F.ECC_CORRECTED)
    bar = np.maximum(
        p(w.rows, "memory_ecc", "corrected_per_minute"),
        fleet_outlier(rate, fresh, p(w.rows, "memory_ecc", "corrected_mad_k")),
    )
    storm = np.nan_to_num(rate) > bar
    state = np.where(uncorrected | retired_failed, FAILED, PREDICTED).astype(np.int8)
    return uncorrected | retired_failed | retired_warn | storm, state


def power_delivery(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Power delivery faults reported in the window, or voltage outside its critical limits."""
    p = g.param
    errors = w.increase(F.POWER_ERRORS) >= p(w.rows, "power_delivery", "errors")
    voltage = w.fraction(F.VOLT_BAD) >= p(w.rows, "power_delivery", "voltage_fraction")
    return errors | voltage, _state(g, w.rows, "power_delivery")


def power_throttling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Power throttling a large share of the time, or power pinned at its cap while throttled.
    (A busy GPU at its cap is normal; pinned and held down is the evidence.)"""
    p = g.param
    share = w.share(F.THROTTLE_POWER)
    throttled = share >= p(w.rows, "power_throttling", "throttle_share")
    pinned = (w.fraction(F.POWER_PINNED) >= p(w.rows, "power_throttling", "pinned_fraction")) & (share > 0)
    return throttled | pinned, _state(g, w.rows, "power_throttling")


def memory_pressure(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Memory full for most of the window, or out-of-memory events recurring."""
    p = g.param
    full = w.fraction(F.MEM_FULL) >= p(w.rows, "memory_pressure", "min_fraction")
    window = p(w.rows, "memory_pressure", "events_window")
    ooms = w.events_since(F.OUT_OF_MEMORY, window) >= p(w.rows, "memory_pressure", "out_of_memory")
    return full | ooms, _state(g, w.rows, "memory_pressure")


def link(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Link errors above both DCGM's expected replay rate for the negotiated width and
    generation and the fleet's norm; or width/generation below the maximum, sustained."""
    p = g.param
    rate = w.per_minute(F.LINK_ERRORS)
    expected = np.nan_to_num(w.mean(F.LINK_EXPECTED))
    bar = np.maximum(expected, fleet_outlier(rate, fresh, p(w.rows, "link", "mad_k")))
    errors = np.nan_to_num(rate) > bar
    fraction = p(w.rows, "link", "downgrade_fraction")
    down = (w.fraction(F.WIDTH_DOWN) >= fraction) | (w.fraction(F.GEN_DOWN) >= fraction)
    return errors | down, _state(g, w.rows, "link")


def driver_errors(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fatal-class driver error in the window fails the device; application-class errors
    repeated within their events window degrade it."""
    p = g.param
    fatal = (w.increase(F.DRIVER_RESET) + w.increase(F.DRIVER_REBOOT) + w.increase(F.DRIVER_MECHANICAL)) >= 1
    window = p(w.rows, "driver_errors", "events_window")
    repeated = w.events_since(F.DRIVER_APPLICATION, window) >= p(w.rows, "driver_errors", "application_repeats")
    return fatal | repeated, np.where(fatal, FAILED, DEGRADED).astype(np.int8)


def driver_floor(w: Window) -> np.ndarray:
    """The least remediation a driver error calls for, by its most disruptive class in the
    window: a reset-class code needs reset_device, XID 79 reboot_node, a mechanical fault
    replace_device (check the hardware); application codes start at the ladder's first step."""
    code = REMEDIATIONS.index
    floor = np.zeros(w.rows.shape, dtype=np.int8)
    floor = np.where(w.increase(F.DRIVER_RESET) >= 1, code("reset_device"), floor)
    floor = np.where(w.increase(F.DRIVER_REBOOT) >= 1, code("reboot_node"), floor)
    return np.where(w.increase(F.DRIVER_MECHANICAL) >= 1, code("replace_device"), floor).astype(np.int8)


def firmware(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Firmware on the policy's deny list or below its minimum (judged when attributes change)."""
    return g.firmware_bad[w.rows].copy(), _state(g, w.rows, "firmware")


def device_reset(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device resets recurring within the events window."""
    p = g.param
    resets = w.events_since(F.RESETS, p(w.rows, "device_reset", "events_window"))
    return resets >= p(w.rows, "device_reset", "resets"), _state(g, w.rows, "device_reset")


def vendor_status(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device or its vendor library reports a state other than ok."""
    reported = np.nan_to_num(w.latest[:, F.VENDOR_STATE]).astype(np.int8)
    return reported > OK, reported


WINDOW_RULES: dict[str, Rule] = {
    "thermal": thermal,
    "cooling": cooling,
    "memory_ecc": memory_ecc,
    "power_delivery": power_delivery,
    "power_throttling": power_throttling,
    "memory_pressure": memory_pressure,
    "link": link,
    "driver_errors": driver_errors,
    "firmware": firmware,
    "device_reset": device_reset,
    "vendor_status": vendor_status,
}


def evaluate(w: Window, groups: PolicyGroups, fresh: np.ndarray, lost: np.ndarray) -> Evidence:
    """Every reason's evidence for the rows of ``w``. ``fresh``: the device reports; ``lost``:
    it stopped while its node still reports (``device_lost``)."""
    n = w.rows.shape[0]
    present = np.zeros((n, len(REASONS)), dtype=bool)
    state = np.zeros((n, len(REASONS)), dtype=np.int8)
    floor = np.zeros((n, len(REASONS)), dtype=np.int8)
    for reason, rule in WINDOW_RULES.items():
        ev, st = rule(w, groups, fresh)
        present[:, R[reason]] = ev & fresh
        state[:, R[reason]] = st
    floor[:, R["driver_errors"]] = driver_floor(w)
    present[:, R["device_lost"]] = lost
    state[:, R["device_lost"]] = FAILED
    return Evidence(present, state, floor)
