"""The rules: each failure reason's evidence, judged for every device at once.

Every rule reads the devices' windows through :class:`~otel_dra.classifier.reader.Window` (sums and
counts kept by the window store, so reading a window is O(1) per device) and its thresholds as typed
per-row values (``w.params``, :mod:`otel_dra.classifier.thresholds`), and returns, per device, whether
its evidence is present now, the ``hw.state`` it implies, and the ladder step its remediation starts at.

Rules judge only devices whose telemetry is fresh: a silent device's window is frozen, and
what it means is ``device_lost``'s or ``stale``'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from otel_dra.classifier.features import F
from otel_dra.classifier.layout import (
    DEGRADED,
    DUTY_SPAN,
    FAILED,
    FIRMWARE,
    NODE,
    OK,
    PREDICTED,
    WORKLOAD,
    R,
)
from otel_dra.classifier.numeric import any_of, nan_to_num
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.rates import RateVerdict
from otel_dra.classifier.reader import Window
from otel_dra.classifier.thresholds import RateParams
from otel_dra.classifier.topology import Topology, link_scoped
from otel_dra.vocabulary import REASONS, REMEDIATIONS

#: Peers at a device's load whose reference share of time at the power cap is under this are never capped.
QUIET_PEERS = 0.01


@dataclass
class Evidence:
    """Per (row, reason): evidence present now, the state it implies, the least remediation it needs,
    and what it is about (a SCOPE code: the device, the workload on it, its node)."""

    present: np.ndarray  # bool (n, R)
    state: np.ndarray  # int8 (n, R)
    floor: np.ndarray  # int8 (n, R): a REMEDIATIONS index the remediation is at least
    scope: np.ndarray  # int8 (n, R): a SCOPE code
    #: For a node-scoped reason: how many of the row's node's reporting devices show it, and how many report.
    node_hits: np.ndarray  # int32 (n, R)
    node_devices: np.ndarray  # int32 (n,)
    #: For a link or firmware scope: the group's code (:class:`~otel_dra.classifier.topology.GroupNames`; 0: none)
    #: and, for a link, how many of its known devices show the reason and how many it has.
    group: np.ndarray  # int32 (n, R)
    group_hits: np.ndarray  # int32 (n, R)
    group_devices: np.ndarray  # int32 (n, R)

    @classmethod
    def empty(cls, n: int) -> Evidence:
        r = len(REASONS)
        return cls(
            np.zeros((n, r), dtype=bool),
            np.zeros((n, r), dtype=np.int8),
            np.zeros((n, r), dtype=np.int8),
            np.zeros((n, r), dtype=np.int8),
            np.zeros((n, r), np.int32),
            np.zeros(n, np.int32),
            np.zeros((n, r), np.int32),
            np.zeros((n, r), np.int32),
            np.zeros((n, r), np.int32),
        )


Rule = Callable[[Window, PolicyGroups, np.ndarray], tuple[np.ndarray, np.ndarray]]


def thermal(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sustained temperature above the sensor's high.degraded limit, thermal throttling or the device's
    own hardware slowdown a share of the time, in the window or for the rule's duty of the duty span
    (excursions that come and go): ``state``; sustained above high.critical: ``critical_state``. Below
    every limit, running hotter than its peers at the same load (:meth:`Window.thermal_peers`):
    ``peers.state``."""
    t = w.params.thermal
    hot = w.fraction(F.TEMP_HOT) >= t.min_fraction
    throttled = w.share(F.THROTTLE_THERMAL) >= t.throttle_share
    slowdown = (w.share(F.THROTTLE_SLOWDOWN) >= t.slowdown_share) | w.duty(
        F.THROTTLE_SLOWDOWN, "thermal", t.slowdown_share, share=True
    )
    recurring = w.duty(F.TEMP_HOT, "thermal", t.duty) | w.duty(F.THROTTLE_THERMAL, "thermal", t.duty, share=True)
    critical = w.fraction(F.TEMP_CRIT) >= t.min_fraction
    limits = hot | throttled | slowdown | recurring | critical
    peers = w.thermal_peers().flagged
    state = np.where(critical, t.critical_state, np.where(limits, t.state, t.peers.state))
    return limits | peers, state


def cooling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fan near zero (or below its own low limit) while the device is warm, sustained in the
    window or recurring for the rule's duty of the duty span (a fan that stalls now and then)."""
    c = w.params.cooling
    sustained = w.fraction(F.COOLING_BAD) >= c.min_fraction
    return sustained | w.duty(F.COOLING_BAD, "cooling", c.duty), c.state


def memory_ecc(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uncorrected errors in the window or retired pages at the limit fail the device; retired
    pages near it, or a corrected-error rate far above its cohort's (:meth:`Window.rate`), predict
    failure."""
    m = w.params.memory_ecc
    uncorrected = w.increase(F.ECC_UNCORRECTED) >= m.uncorrected
    retired = nan_to_num(w.latest[F.RETIRED_TOTAL])
    retired_failed = retired >= m.retired_pages_failed
    retired_warn = retired >= m.retired_pages_predicted
    storm = corrected_rate(w).flagged
    state = np.where(uncorrected | retired_failed, FAILED, PREDICTED).astype(np.int8)
    return uncorrected | retired_failed | retired_warn | storm, state


def corrected_rate(w: Window) -> RateVerdict:
    """The corrected-ECC rate against the policy's absolute bar and the device's cohort."""
    return w.rate(F.ECC_CORRECTED, *_corrected_bars(w))


def _corrected_bars(w: Window) -> tuple[RateParams, np.ndarray]:
    m = w.params.memory_ecc
    return m.corrected, m.corrected_per_minute


def power_delivery(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Power delivery faults reported in the window, voltage outside its critical limits (in the window,
    or recurring), or the hardware power brake asserted a share of the window's or the duty span's time."""
    d = w.params.power_delivery
    errors = w.increase(F.POWER_ERRORS) >= d.errors
    voltage = w.fraction(F.VOLT_BAD) >= d.voltage_fraction
    brake = (w.share(F.THROTTLE_BRAKE) >= d.brake_share) | w.duty(
        F.THROTTLE_BRAKE, "power_delivery", d.brake_share, share=True
    )
    present = errors | voltage | brake | w.duty(F.VOLT_BAD, "power_delivery", d.duty)
    return present, d.state


def power_throttling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Capped far more than its peers under comparable load (:meth:`Window.cap_peers`): its share of the duty
    span's time at the power cap at least ``duty``, ``peer_margin`` above its peers' reference share and above
    its node's median, and so over the rate span too, or ``peer_margin`` more than the duty span's share of
    busy samples (capped while not busy), or against peers that are never capped while capped for ``duty`` of
    the rate span too or in two or more runs of minutes that do not follow its load (:meth:`Window.span_runs`,
    ``load_coupling``); once on, of the window's at least ``throttle_share``, or of the duty span's. Or its
    power limit under ``limit_ratio`` of its cohort's. A busy GPU at its cap is how the power limit works;
    without peers it is not judged."""
    t = w.params.power_throttling
    peers = w.cap_peers()
    duty = t.duty
    held = w.on[:, R["power_throttling"]]
    stay = w.groups.policy.horizon.duty_hold_ratio
    margin = t.peer_margin
    margin = np.where(held, stay * margin, margin)
    # The spans side by side (the window, the duty span, the rate span: rows of ``peers``' arrays), each against
    # its own bar.
    bars = np.array((t.throttle_share, duty, duty))  # (np.array of them: a fifth of np.stack's fixed cost)
    need = np.where(held, stay * bars, bars)
    # NaN is "no peers" or "no reference": comparisons with it are expected.
    with np.errstate(invalid="ignore"):
        # Peers at its load never capped leave no spread to clear: the bar alone then.
        above = np.where(peers.references < QUIET_PEERS, 0.0, margin)
        above_node = np.isnan(peers.node_medians) | (peers.shares - peers.node_medians >= margin)
        found = (peers.shares >= need) & (peers.shares - peers.references >= above) & above_node
        # It enters on the duty span, confirmed over the rate span, or by being capped while not busy, or by peers
        # at its load that are never capped (15 and 30 minutes: a leaky GPU serving a traffic burst sits at its cap
        # for minutes, and only while busy, where some of its peers do too); once on, the window or the duty span
        # holds it.
        idle_capped = peers.shares[1] - w.span_fraction(F.BUSY, DUTY_SPAN) >= margin
        # Peers never capped over the duty span: capped for ``duty`` of the rate span too while its peers were never
        # capped over that span either (peers capped over the half hour, if not the last quarter, make its half
        # hour no outlier: the load moved), or in more than one run of minutes (one traffic burst that a leaky GPU
        # alone rode at its cap fills a duty span in one run; a lowered limit holds it down every time its job
        # asks, and a limit that comes and goes does so again).
        quiet = found[1] & (peers.references[1] < QUIET_PEERS)
        confirmed = (peers.shares[2] >= duty) & ~(peers.references[2] >= QUIET_PEERS)
        # A cap reached only in its busiest minutes follows its load (a leaky GPU at each burst of traffic): its
        # capped minutes' mean utilization more than `load_coupling` above its other minutes'.
        shape = w.span_runs(F.THROTTLE_POWER, DUTY_SPAN, quiet & ~confirmed)
        follows_load = shape.util_on - shape.util_off > t.load_coupling
        quiet_peers = quiet & (confirmed | ((shape.runs >= 2) & ~follows_load))
        out = (found[1] & (found[2] | idle_capped | quiet_peers)) | (held & (found[0] | found[1]))
        # A power limit well under its cohort's: lowered by firmware, a misconfiguration or the board (the
        # remediation's "check firmware power limits"), it holds the device down whenever its job asks for more.
        out |= peers.limit < t.limit_ratio * peers.limit_median
    return out, t.state


def memory_pressure(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-memory events that recur on the device itself (a job's crash on all its GPUs is the workload's:
    see :mod:`otel_dra.classifier.workload`); memory held full only with ``full_is_evidence``."""
    m = w.params.memory_pressure
    ooms = w.events_since(F.OUT_OF_MEMORY, m.events_window) >= m.out_of_memory
    if not any_of(m.full_is_evidence):  # (the default: a full memory is how a busy GPU runs, no fault)
        return ooms, m.state
    full = (w.fraction(F.MEM_FULL) >= m.min_fraction) | w.duty(F.MEM_FULL, "memory_pressure", m.duty)
    full &= m.full_is_evidence
    return ooms | full, m.state


def link(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Link errors above both DCGM's expected replay rate for the negotiated width and
    generation and the cohort's norm (:meth:`Window.rate`); or width/generation below the
    maximum, sustained or recurring."""
    k = w.params.link
    errors = link_rate(w).flagged
    down = (w.fraction(F.WIDTH_DOWN) >= k.downgrade_fraction) | (w.fraction(F.GEN_DOWN) >= k.downgrade_fraction)
    recurring = w.duty(F.WIDTH_DOWN, "link", k.duty) | w.duty(F.GEN_DOWN, "link", k.duty)
    return errors | down | recurring, k.state


def link_rate(w: Window) -> RateVerdict:
    """The link error rate against DCGM's expected replays and the device's cohort."""
    return w.rate(F.LINK_ERRORS, *_link_bars(w))


def _link_bars(w: Window) -> tuple[RateParams, np.ndarray]:
    return w.params.link.errors, nan_to_num(w.mean(F.LINK_EXPECTED))


#: The counters the rules judge by their rate against their cohort (:meth:`Window.rate`), with each one's bars:
#: :func:`evaluate` has them judged side by side before the rules ask.
RATE_BARS: dict[F, Callable[[Window], tuple[RateParams, np.ndarray]]] = {
    F.ECC_CORRECTED: _corrected_bars,
    F.LINK_ERRORS: _link_bars,
}


def driver_errors(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fatal-class driver error in the window fails the device; application-class errors
    repeated within their events window degrade it."""
    d = w.params.driver_errors
    fatal = (w.increase(F.DRIVER_RESET) + w.increase(F.DRIVER_REBOOT) + w.increase(F.DRIVER_MECHANICAL)) >= 1
    repeated = w.events_since(F.DRIVER_APPLICATION, d.events_window) >= d.application_repeats
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
    return g.firmware_bad[w.rows].copy(), w.params.firmware.state


def device_reset(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device resets recurring within the events window."""
    d = w.params.device_reset
    resets = w.events_since(F.RESETS, d.events_window)
    return resets >= d.resets, d.state


def vendor_status(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device or its vendor library reports a state other than ok."""
    reported = nan_to_num(w.latest[F.VENDOR_STATE]).astype(np.int8)
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


def evaluate(
    w: Window,
    groups: PolicyGroups,
    fresh: np.ndarray,
    lost: np.ndarray,
    topology: Topology | None = None,
    named: np.ndarray | None = None,
    recent: np.ndarray | None = None,
) -> Evidence:
    """Every reason's evidence for the rows of ``w``, then its scope (:func:`scoped`). ``fresh``: the device
    reports; ``lost``: it stopped while its node still reports (``device_lost``); ``topology``: what the rows
    share; ``named``: per row, its firmware version stands out from its model's others across the fleet
    (:mod:`otel_dra.classifier.firmware_rates`); ``recent``: per (row, reason), held with evidence within the
    window, the device's or a link's (what its group's devices showed in the same window)."""
    ev = Evidence.empty(w.rows.shape[0])
    w.rates({f: bars(w) for f, bars in RATE_BARS.items()})
    for reason, rule in WINDOW_RULES.items():
        on, st = rule(w, groups, fresh)
        ev.present[:, R[reason]] = on & fresh
        ev.state[:, R[reason]] = st
    if named is not None:
        ev.present[:, R["firmware"]] |= named & fresh
    ev.floor[:, R["driver_errors"]] = driver_floor(w)
    ev.present[:, R["device_lost"]] = lost
    ev.state[:, R["device_lost"]] = FAILED
    scoped(w, groups, ev)
    if topology is not None:
        shared_scoped(w, groups, ev, fresh | lost, topology, recent)
    return ev


def shared_scoped(
    w: Window,
    groups: PolicyGroups,
    ev: Evidence,
    known: np.ndarray,
    topology: Topology,
    recent: np.ndarray | None = None,
) -> None:
    """What devices share: evidence on most of one switch's or fabric's devices is the link's
    (:func:`~otel_dra.classifier.topology.link_scoped`); a firmware finding is about its version, across the fleet
    (scope ``firmware``, its group ``firmware/<model>/<version>``), whether the policy named it or the fleet's
    rates did."""
    link_scoped(
        w.rows,
        w.nodes,
        w.n_nodes,
        known,
        topology,
        groups.policy.link,
        ev.present,
        ev.scope,
        ev.group,
        ev.group_hits,
        ev.group_devices,
        recent,
    )
    r = R["firmware"]
    version = topology.firmware[w.rows]
    on = ev.present[:, r] & (version > 0)
    ev.scope[on, r] = FIRMWARE
    ev.group[on, r] = version[on]


def scoped(w: Window, groups: PolicyGroups, ev: Evidence) -> Evidence:
    """What each reason's evidence is about (``policy.scopes``):

    - **node**: a reason of ``scopes.node.reasons`` present on at least ``min_devices`` of a node's reporting
      devices and ``share`` of them at once (all eight GPUs braked: the node's PSU, not eight GPUs);
    - **workload**: a job that keeps crashing. Where the device has no evidence of its own for the reason, its
      node's job crashes (:mod:`otel_dra.classifier.workload`) that reach the rule's repeat count within its
      events window are the workload's, on each GPU it held: ``hw.state`` ok, remediation ``check_workload``.
      Memory pressure is the workload's too, and degraded: out-of-memory events recurring on one GPU alone.
    """
    policy = groups.policy
    fresh = w.fresh
    node = w.nodes
    reporting = np.bincount(node[fresh], minlength=w.n_nodes)
    ev.node_devices[:] = reporting[node]
    for reason in policy.node.reasons:
        r = R[reason]
        on = ev.present[:, r] & fresh
        if not any_of(on):
            continue
        hits = np.bincount(node[on], minlength=w.n_nodes)
        wide = (hits >= policy.node.min_devices) & (hits >= policy.node.share * reporting)
        mark = on & wide[node]
        ev.scope[mark, r] = NODE
        ev.node_hits[:, r] = hits[node]
    # Memory pressure is about what runs on the device (failure-modes.md: check_workload, scope workload): even
    # out-of-memory events that recur on one GPU alone may be one job's (a one-GPU replica that keeps failing to
    # fit) as well as the device's; degraded, shown as the workload's.
    ev.scope[ev.present[:, R["memory_pressure"]], R["memory_pressure"]] = WORKLOAD
    driver, oom = w.params.driver_errors, w.params.memory_pressure
    for reason, feature, window, repeats in (
        ("driver_errors", F.WORKLOAD_APPLICATION, driver.events_window, driver.application_repeats),
        ("memory_pressure", F.WORKLOAD_OOM, oom.events_window, oom.out_of_memory),
    ):
        r = R[reason]
        crashes = w.events_since(feature, window) >= repeats
        job = crashes & fresh & ~ev.present[:, r]
        if any_of(job):
            ev.present[job, r] = True
            ev.state[job, r] = OK
            ev.floor[job, r] = 0
            ev.scope[job, r] = WORKLOAD
    return ev
