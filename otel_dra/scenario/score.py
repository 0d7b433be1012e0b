"""Score verdict lines (as ``otel-dra replay`` writes them) against a scenario's labels.

Why its own scorer: a messy fleet asks more than "was each fault flagged". Hard faults must
reach ``failed``/Unhealthy with a matching reason within their deadline; intermittent faults
must not flap; traps and healthy devices must stay quiet; only a silent node may read Unknown.

Semantics, exactly:

- A device's state at time t is its last verdict line at or before t (lines are written only
  on change). Lines are ordered by ``time_unix_nano``, file order breaking ties.
- Times are compared as they are: label times are in each node's own clock (the base of that
  node's points), so verdict times must be too (a sample time of the device's node).
- Non-ok: health Unhealthy, or hw.state degraded, predicted_failure or failed. An *episode* is a
  maximal run of non-ok lines; it ends at the next line that is not non-ok (open: never).
- A fault is caught when, at some time in [onset - interval_s, onset + deadline_s], the device's
  state matches: non-ok (soft) or failed/Unhealthy (hard), with a reason among the label's. A
  state already held at the window's start counts (delay 0).
- A false positive is an episode that overlaps no fault window of its device: [onset -
  interval_s, end) with end the fault's ``end_unix_nano`` + its deadline when labelled, else
  the end of the recording. Traps have no window, so every episode on them is false.
- Extra episodes: episodes of a faulted device that end after onset - interval_s, beyond the first.
- A spurious Unknown is a maximal run of Unknown lines outside an excuse: on the silent node
  from the silence start until 5 minutes after it ends; on a lost device from its onset on.

Scope (verdict lines and labels of busy fleets; older files have none and score as before):

- A verdict line's ``scope`` is ``device`` when absent; ``group`` names what a non-device scope is
  about (``node/train-007``). A fault labelled with a ``scope`` is caught only by lines whose scope
  and group are the label's; a miss whose reason matched in another scope says so.
- Workload traps (``job_crash``, ``crash_loop``): a job's crash puts an application XID and an OOM
  on every GPU it held. Their GPUs (the trap's ``detail.hw.ids``, else its node's) are watched from
  the trap's time to 1 h after its last crash (``detail.to_unix_nano`` or the latest of
  ``detail.crashes_unix_nano``). An episode there outside every fault window of its device is
  *device-scoped* when one of its non-ok lines in that window has scope ``device``: the
  "workload traps with a device-scoped non-ok verdict" figure (target 0, only for labels with such
  traps). An episode there whose non-ok lines are all of another scope (``workload``) is the right
  answer, not a false positive: it is counted in ``workload_scoped_episodes`` instead.
- Shared parts (labels of big fleets): a fault of scope ``link`` (a PCIe switch's or a fabric's GPUs, one
  label each) is caught only by lines of scope ``link`` and its group (``link_group_*``); a link fault of
  one GPU alone is labelled scope ``device`` and caught only by device-scoped lines (``lone_link_*``). A
  ``firmware`` fault lists its version's GPUs in ``devices``: each must have, in [onset - interval_s,
  onset + deadline_s] (the deadline is the end of the recording), a non-ok line with reason ``firmware``,
  scope ``firmware`` and the fault's group, or beside another reason (a fault of the GPU's own, or of its switch,
  which a verdict's one scope follows when it is as bad or worse) (``firmware_devices_*``); a GPU outside every
  bad version with a non-ok line naming firmware (reason or scope) is counted in ``firmware_wrong_devices``.
  Episodes on a listed GPU from the onset whose reasons are all the fault's or its events' (driver_errors, device_reset,
  device_lost), and on the GPU of a listed event of another version from that event with the events'
  reasons, are not false positives (``firmware_event_episodes``). No GPU of a link, firmware or node fault
  (without a fault of its own) may ever get remediation ``replace_device`` (``replace_on_group_devices``).
- False positives are also split by health (``fp_unhealthy_episodes``: the episode reached
  Unhealthy; ``fp_degraded_episodes``: degraded or predicted_failure only) and by reason
  (``fp_by_reason``, ``fp_unhealthy_by_reason``: an episode counts once for each reason it carried).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from otel_dra.classifier.verdict import Verdict, VerdictInputError
from otel_dra.scenario.figures import SILENT_PROBE_S, Score
from otel_dra.scenario.kinds import LOST_KINDS
from otel_dra.scenario.score_labels import check_labels, label_time, load_labels, read_verdict_lines

NON_OK_STATES: Final = frozenset({"degraded", "predicted_failure", "failed"})
HEALTH: Final = frozenset({"Healthy", "Unhealthy", "Unknown"})
#: Unknown is excused on the silent node until this long after the silence ends.
UNKNOWN_GRACE_S: Final = 300
EXAMPLES: Final = 10
#: Trap kinds a job's crash leaves (its GPUs must not be called faulty for it), and how long after the last
#: crash they are watched.
WORKLOAD_TRAP_KINDS: Final = frozenset({"job_crash", "crash_loop"})
WORKLOAD_WATCH_S: Final = 3600
DEVICE_SCOPE: Final = "device"
#: Scopes of a fault on a part several GPUs share: none of its GPUs is to be replaced for it.
GROUP_SCOPES: Final = frozenset({"link", "firmware", "node"})
#: What each fatal event of a firmware fault's model says about its GPU on its own (an XID, a reset, a GPU
#: off the bus for a moment): on the version's GPUs, and on the GPU of an event of another version, these
#: reasons are right, not false positives.
FIRMWARE_EVENT_REASONS: Final = frozenset({"driver_errors", "device_reset", "device_lost"})


@dataclass(frozen=True)
class _Line:
    t: int
    health: str
    state: str | None
    reasons: frozenset[str]
    scope: str = DEVICE_SCOPE
    group: str | None = None
    remediation: str = "none"

    @property
    def non_ok(self) -> bool:
        return self.health == "Unhealthy" or self.state in NON_OK_STATES

    @property
    def failing(self) -> bool:
        return self.health == "Unhealthy" or self.state == "failed"


@dataclass
class _Episode:
    start: int
    stop: float  # math.inf while open
    reasons: set[str]
    states: set[str]
    unhealthy: bool
    device_spans: list[tuple[int, float]] = field(default_factory=list)  # when a line of scope device held it


def _episodes(seq: list[_Line], unknown: bool = False) -> list[_Episode]:
    """Maximal runs of non-ok lines (or, with ``unknown``, of Unknown lines)."""
    out: list[_Episode] = []
    cur: _Episode | None = None
    for i, v in enumerate(seq):
        inside = v.health == "Unknown" if unknown else v.non_ok
        if inside:
            if cur is None:
                cur = _Episode(v.t, math.inf, set(), set(), False)
                out.append(cur)
            cur.reasons |= v.reasons
            if v.state:
                cur.states.add(v.state)
            cur.unhealthy |= v.health == "Unhealthy"
            if v.scope == DEVICE_SCOPE:
                cur.device_spans.append((v.t, seq[i + 1].t if i + 1 < len(seq) else math.inf))
        elif cur is not None:
            cur.stop = v.t
            cur = None
    return out


def _parse(line: Any, number: int) -> tuple[tuple[str, str], _Line] | None:
    try:
        v = Verdict.from_json(line, f"verdict line {number}", timed=True)
    except VerdictInputError:
        return None
    line = _Line(v.time_unix_nano, v.health, v.state, frozenset(v.reasons), v.scope, v.group, v.remediation)
    return (v.node, v.hw_id), line


def _overlaps(ep: _Episode, lo: float, hi: float) -> bool:
    return ep.stop > lo and ep.start < hi


@dataclass(frozen=True)
class _Scoring:
    """What every part of a scoring reads: the labels, the verdicts by device, and the times they share."""

    labels: dict[str, Any]
    by_dev: dict[tuple[str, str], list[_Line]]
    step: int  # the labels' interval, ns: a fault's window opens this long before its onset
    t0: int
    end: int
    devices: list[tuple[str, str]]
    node_devices: dict[str, list[tuple[str, str]]]


def score(labels: dict[str, Any], verdict_lines: Iterable[Any]) -> Score:
    """Score verdict lines (dicts, as ``otel-dra replay`` writes them) against ``labels``.

    An item that is not a well-formed verdict (``None`` for a line that wasn't JSON, a missing
    key, an unknown health) is counted in ``bad_lines`` and skipped. Raises :class:`LabelsError`
    for labels that can't be scored against.
    """
    check_labels(labels)
    out = Score()
    by_dev: dict[tuple[str, str], list[_Line]] = defaultdict(list)
    for number, item in enumerate(verdict_lines, 1):
        parsed = _parse(item, number)
        if parsed is None:
            out.bad_lines += 1
            continue
        by_dev[parsed[0]].append(parsed[1])
        out.verdict_lines += 1
    for seq in by_dev.values():
        seq.sort(key=lambda v: v.t)  # stable: file order breaks ties

    step = round(float(labels["interval_s"]) * 1e9)
    t0 = int(labels["t0_unix_nano"])
    devices = [(d["k8s.node.name"], d["hw.id"]) for d in labels["devices"]]
    node_devices: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in devices:
        node_devices[key[0]].append(key)
    sc = _Scoring(labels, by_dev, step, t0, t0 + int(labels["ticks"]) * step, devices, node_devices)
    labelled = set(devices)
    out.devices_total = len(labelled)
    out.devices_with_verdicts = sum(1 for key in labelled if by_dev.get(key))
    out.unlabelled_devices = sum(1 for key in by_dev if key not in labelled)
    _faults(sc, out)
    _firmware(sc, out)
    _replacements(sc, out)
    _false_positives(sc, out)
    _unknowns(sc, out)
    _silent_node(sc, out)
    return out


def _faults(sc: _Scoring, out: Score) -> None:
    """Faults: caught in time, with a matching reason (and failed, for hard ones)? And how many extra
    episodes each had."""
    delays: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[str, list[float]] = defaultdict(list)
    extra_all: list[int] = []
    extra_int: list[int] = []
    for f in sc.labels["faults"]:
        key = (f["k8s.node.name"], f["hw.id"])
        seq = sc.by_dev.get(key, [])
        hard = f["severity"] == "hard"
        onset = int(f["onset_unix_nano"])
        lo, hi = onset - sc.step, onset + round(float(f["deadline_s"]) * 1e9)
        wanted = set(f["reasons"])
        scope = (f["scope"], f.get("group")) if f.get("scope") is not None else None
        hit, seen, states, late, elsewhere = _detect(seq, lo, hi, wanted, hard, scope, f.get("scope") == "firmware")
        if f.get("scope") == "link":
            out.link_group_total += 1
            out.link_group_detected += hit is not None
        elif f.get("scope") == DEVICE_SCOPE and "link" in wanted:
            out.lone_link_total += 1
            out.lone_link_detected += hit is not None
        if hard:
            out.hard_total += 1
        else:
            out.soft_total += 1
        if hit is not None:
            delay = max(0, hit - onset) / 1e9
            delays[f["severity"]].append(delay)
            by_kind[f["kind"]].append(delay)
            if hard:
                out.hard_detected += 1
            else:
                out.soft_detected += 1
        else:
            miss = {
                "kind": f["kind"],
                "k8s.node.name": key[0],
                "hw.id": key[1],
                "why": _why(seen, states, wanted, hard, late, onset, scope, elsewhere),
            }
            (out.hard_missed if hard else out.soft_missed).append(miss)
        eps = [e for e in _episodes(seq) if e.stop > lo]
        extra = max(0, len(eps) - 1)
        extra_all.append(extra)
        if f.get("intermittent"):
            extra_int.append(extra)
    out.median_delay_s = {
        sev: round(statistics.median(delays[sev]), 1) if delays[sev] else None for sev in ("hard", "soft")
    }
    out.median_delay_by_kind_s = {k: round(statistics.median(v), 1) for k, v in sorted(by_kind.items())}
    out.intermittent_faults = len(extra_int)
    out.extra_episodes_per_intermittent = round(sum(extra_int) / len(extra_int), 3) if extra_int else 0.0
    out.extra_episodes_per_fault = round(sum(extra_all) / len(extra_all), 3) if extra_all else 0.0


def _listed(f: dict[str, Any]) -> list[tuple[str, str]]:
    """A fault's GPUs: its ``devices`` (a firmware fault's version) with its own, else its own."""
    own = (f["k8s.node.name"], f["hw.id"])
    listed = [(d["k8s.node.name"], d["hw.id"]) for d in f.get("devices") or []]
    return listed + ([own] if own not in listed else [])


def _on_version(f: dict[str, Any]) -> list[tuple[str, str]]:
    """Every GPU of a firmware fault's version: those it lists, and those lost on their own (``lost_devices``)."""
    return _listed(f) + [(d["k8s.node.name"], d["hw.id"]) for d in f.get("lost_devices") or []]


def _firmware(sc: _Scoring, out: Score) -> None:
    """Bad firmware: every GPU of the version named firmware (scope and group) by the deadline; and no GPU
    outside every bad version named firmware (a GPU of the version lost on its own, ``lost_devices``, may be named
    while it still reports, and need not be)."""
    bad: set[tuple[str, str]] = set()
    for f in sc.labels["faults"]:
        if f.get("scope") != "firmware":
            continue
        bad.update(_on_version(f))
        onset = int(f["onset_unix_nano"])
        lo, hi = onset - sc.step, onset + round(float(f["deadline_s"]) * 1e9)
        for key in _listed(f):
            bad.add(key)
            out.firmware_devices_total += 1
            hit, seen, states, late, elsewhere = _detect(
                sc.by_dev.get(key, []), lo, hi, set(f["reasons"]), False, ("firmware", f.get("group")), outranked=True
            )
            if hit is not None:
                out.firmware_devices_detected += 1
            elif len(out.firmware_missed) < EXAMPLES:
                why = _why(seen, states, set(f["reasons"]), False, late, onset, ("firmware", f.get("group")), elsewhere)
                out.firmware_missed.append({"k8s.node.name": key[0], "hw.id": key[1], "why": why})
    if not bad:
        return
    for key, seq in sorted(sc.by_dev.items()):
        named = [v for v in seq if v.non_ok and ("firmware" in v.reasons or v.scope == "firmware")]
        if key in bad or not named:
            continue
        out.firmware_wrong_devices += 1
        if len(out.firmware_wrong_examples) < EXAMPLES:
            example = {"k8s.node.name": key[0], "hw.id": key[1], "group": named[0].group}
            out.firmware_wrong_examples.append({**example, "from_s": round((named[0].t - sc.t0) / 1e9, 1)})


def _replacements(sc: _Scoring, out: Score) -> None:
    """No GPU of a fault on a shared part (link, firmware, node) is ever to be replaced, unless it has a
    fault of its own besides."""
    group: set[tuple[str, str]] = set()
    own: set[tuple[str, str]] = set()
    for f in sc.labels["faults"]:
        if f.get("scope") in GROUP_SCOPES:
            group.update(_listed(f))
        else:
            own.add((f["k8s.node.name"], f["hw.id"]))
    watched = sorted(group - own)
    out.group_fault_devices = len(watched)
    for key in watched:
        said = [v for v in sc.by_dev.get(key, []) if v.remediation == "replace_device"]
        if said:
            out.replace_on_group_devices += 1
            if len(out.replace_examples) < EXAMPLES:
                at = round((said[0].t - sc.t0) / 1e9, 1)
                out.replace_examples.append({"k8s.node.name": key[0], "hw.id": key[1], "from_s": at})


def _firmware_excuses(sc: _Scoring) -> dict[tuple[str, str], list[tuple[int, frozenset[str]]]]:
    """Each GPU's firmware excuses (from, the reasons excused): a bad version's GPUs (lost ones too) from the
    fault's onset for its reasons and its events'; a GPU with an event of another version from that event, for
    the event's."""
    out: dict[tuple[str, str], list[tuple[int, frozenset[str]]]] = defaultdict(list)
    for f in sc.labels["faults"]:
        if f.get("scope") != "firmware":
            continue
        allowed = FIRMWARE_EVENT_REASONS | frozenset(f["reasons"])
        for key in _on_version(f):
            out[key].append((int(f["onset_unix_nano"]) - sc.step, allowed))
        for e in f.get("events") or []:
            out[(e["k8s.node.name"], e["hw.id"])].append((int(e["at_unix_nano"]) - sc.step, FIRMWARE_EVENT_REASONS))
    return out


def _traps_of(sc: _Scoring) -> dict[tuple[str, str], list[str]]:
    """Each device's trap kinds (a node's trap counts for every device of the node)."""
    traps_of: dict[tuple[str, str], list[str]] = defaultdict(list)
    for trap in sc.labels.get("traps", []):
        if not isinstance(trap, dict) or not isinstance(trap.get("k8s.node.name"), str):
            continue
        kind = str(trap.get("kind", "trap"))
        if isinstance(trap.get("hw.id"), str):
            traps_of[(trap["k8s.node.name"], trap["hw.id"])].append(kind)
        else:
            for key in sc.node_devices.get(trap["k8s.node.name"], []):
                traps_of[key].append(kind)
    return traps_of


def _fault_windows(sc: _Scoring) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Each device's fault windows: [onset - interval_s, end + deadline), or to the end of time."""
    windows: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for f in sc.labels["faults"]:
        onset = int(f["onset_unix_nano"])
        stop: float = math.inf
        if f.get("end_unix_nano") is not None:
            stop = int(f["end_unix_nano"]) + round(float(f["deadline_s"]) * 1e9)
        windows[(f["k8s.node.name"], f["hw.id"])].append((onset - sc.step, stop))
    return windows


def _false_positives(sc: _Scoring, out: Score) -> None:
    """False positives: episodes outside every fault window of their device; on a workload trap's GPUs,
    split by scope (a workload-scoped one is right)."""
    traps_of = _traps_of(sc)
    windows_of = _fault_windows(sc)
    excuses_of = _firmware_excuses(sc)
    fp_by_trap: dict[str, int] = defaultdict(int)
    fp_by_reason: dict[str, int] = defaultdict(int)
    fp_unhealthy_by_reason: dict[str, int] = defaultdict(int)
    watched = _workload_watch(sc.labels, sc.node_devices)
    out.workload_traps = sum(1 for t in sc.labels.get("traps", []) if _is_workload_trap(t))
    out.workload_trap_devices = len(watched)
    device_scoped: set[tuple[str, str]] = set()
    for key, seq in sorted(sc.by_dev.items()):
        windows = windows_of.get(key, [])
        for ep in _episodes(seq):
            if any(_overlaps(ep, lo, hi) for lo, hi in windows):
                continue
            if any(ep.stop > lo and ep.reasons <= allowed for lo, allowed in excuses_of.get(key, [])):
                out.firmware_event_episodes += 1
                continue
            watch = [(lo, hi) for lo, hi in watched.get(key, []) if _overlaps(ep, lo, hi)]
            if watch and not ep.device_spans:  # another scope (the workload's) all along: the right answer
                out.workload_scoped_episodes += 1
                continue
            example = {
                "k8s.node.name": key[0],
                "hw.id": key[1],
                "reasons": sorted(ep.reasons),
                "states": sorted(ep.states),
                "from_s": round((ep.start - sc.t0) / 1e9, 1),
            }
            if any(b > lo and a < hi for a, b in ep.device_spans for lo, hi in watch):
                out.workload_device_scoped_episodes += 1
                device_scoped.add(key)
                if len(out.workload_examples) < EXAMPLES:
                    out.workload_examples.append(dict(example))
            out.fp_episodes += 1
            if ep.unhealthy:
                out.fp_unhealthy_episodes += 1
            else:
                out.fp_degraded_episodes += 1
            for reason in ep.reasons:
                fp_by_reason[reason] += 1
                if ep.unhealthy:
                    fp_unhealthy_by_reason[reason] += 1
            kinds = traps_of.get(key) or ["none"]
            for kind in kinds:
                fp_by_trap[kind] += 1
            if len(out.fp_examples) < EXAMPLES:
                out.fp_examples.append({**example, "traps": kinds})
    out.fp_by_trap = dict(sorted(fp_by_trap.items()))
    out.fp_by_reason = dict(sorted(fp_by_reason.items()))
    out.fp_unhealthy_by_reason = dict(sorted(fp_unhealthy_by_reason.items()))
    out.workload_device_scoped_devices = len(device_scoped)
    out.device_hours = round(len(sc.devices) * (sc.end - sc.t0) / 3.6e12, 3)
    hours = out.device_hours
    out.fp_per_100_device_hours = round(100 * out.fp_episodes / hours, 3) if hours else 0.0
    out.fp_unhealthy_per_100_device_hours = round(100 * out.fp_unhealthy_episodes / hours, 3) if hours else 0.0
    out.fp_degraded_per_100_device_hours = round(100 * out.fp_degraded_episodes / hours, 3) if hours else 0.0


def _unknowns(sc: _Scoring, out: Score) -> None:
    """Unknown: only the silent node (during its silence and a grace after) and lost devices may read it."""
    labels = sc.labels
    skew = {
        n["k8s.node.name"]: round(float(n.get("skew_s") or 0) * 1e9)
        for n in labels.get("nodes", [])
        if isinstance(n, dict) and isinstance(n.get("k8s.node.name"), str)
    }
    silence = labels.get("node_silence")
    excuses: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    if silence is not None:
        lo, hi = int(silence["from_unix_nano"]), int(silence["to_unix_nano"]) + UNKNOWN_GRACE_S * 10**9
        for key in sc.node_devices.get(silence["node"], []):
            excuses[key].append((lo, hi))
    for f in labels["faults"]:
        if f.get("lost") or f["kind"] in LOST_KINDS:
            excuses[(f["k8s.node.name"], f["hw.id"])].append((int(f["onset_unix_nano"]) - sc.step, math.inf))
    spurious_devices = set()
    for key, seq in sorted(sc.by_dev.items()):
        node_end = sc.end + skew.get(key[0], 0)
        runs = _episodes(seq, unknown=True)
        for i, run in enumerate(runs):
            stop = min(run.stop, node_end) if run.stop != math.inf else node_end
            if any(run.start >= lo and stop <= hi for lo, hi in excuses.get(key, [])):
                continue
            out.spurious_unknown_episodes += 1
            spurious_devices.add(key)
            if i == len(runs) - 1 and run.stop == math.inf:
                out.final_unknown_devices += 1
            if len(out.spurious_unknown_examples) < EXAMPLES:
                out.spurious_unknown_examples.append(
                    {
                        "k8s.node.name": key[0],
                        "hw.id": key[1],
                        "from_s": round((run.start - sc.t0) / 1e9, 1),
                        "to_s": None if run.stop == math.inf else round((run.stop - sc.t0) / 1e9, 1),
                    }
                )
    out.spurious_unknown_devices = len(spurious_devices)


def _silent_node(sc: _Scoring, out: Score) -> None:
    """The silent node: Unknown SILENT_PROBE_S into its silence, and never Unhealthy during it."""
    silence = sc.labels.get("node_silence")
    if silence is None:
        return
    out.silent_node = silence["node"]
    lo, hi = int(silence["from_unix_nano"]), int(silence["to_unix_nano"])
    probe = lo + SILENT_PROBE_S * 10**9
    for key in sc.node_devices.get(silence["node"], []):
        seq = sc.by_dev.get(key, [])
        times = [v.t for v in seq]
        out.silent_node_devices += 1
        at = bisect_right(times, probe) - 1
        out.silent_node_unknown += int(at >= 0 and seq[at].health == "Unknown")
        first = bisect_right(times, lo) - 1
        span = seq[max(first, 0) : bisect_right(times, hi)]
        out.silent_node_unhealthy += int(any(v.health == "Unhealthy" for v in span))


def _detect(
    seq: list[_Line],
    lo: int,
    hi: int,
    wanted: set[str],
    hard: bool,
    scope: tuple[str, str | None] | None = None,
    outranked: bool = False,
) -> tuple[int | None, set[str], set[str], int | None, tuple[str, str | None] | None]:
    """When in [lo, hi] the state first matches (None: never); the reasons and states seen non-ok in
    there; for a miss, when it first matched after ``hi`` (None: never); and, for a fault with a
    ``scope`` (scope, group), the first (scope, group) a line with the right reason and state said
    instead in [lo, hi] (None: none did). ``outranked``: a line with the right reason beside another (a fault of
    the device's own, or of its switch) matches whatever its scope: a verdict has one scope, the worse
    reason's (the device's own first among equals; contract section 4)."""
    times = [v.t for v in seq]
    start = max(bisect_right(times, lo) - 1, 0)  # the line whose state holds at lo, if any
    seen: set[str] = set()
    states: set[str] = set()
    elsewhere: tuple[str, str | None] | None = None
    for v in seq[start:]:
        at = max(v.t, lo)
        right = v.non_ok and bool(v.reasons & wanted) and (v.failing or not hard)
        own = outranked and bool(v.reasons - wanted)
        match = right and (scope is None or (v.scope, v.group) == scope or own)
        if at > hi:
            if match:
                return None, seen, states, at, elsewhere
            continue
        if v.non_ok:
            seen |= v.reasons
            states.add(v.state or "-")
            if v.health == "Unhealthy":
                states.add("Unhealthy")
        if match:
            return at, seen, states, None, None
        if right and elsewhere is None:
            elsewhere = (v.scope, v.group)
    return None, seen, states, None, elsewhere


def _why(
    seen: set[str],
    states: set[str],
    wanted: set[str],
    hard: bool,
    late: int | None,
    onset: int,
    scope: tuple[str, str | None] | None = None,
    elsewhere: tuple[str, str | None] | None = None,
) -> str:
    if late is not None:
        return f"caught {round((late - onset) / 1e9)} s after onset, past the deadline"
    if not seen:
        return "never flagged in time"
    if not seen & wanted:
        return f"flagged with other reasons: {', '.join(sorted(seen))}"
    if scope is not None and elsewhere is not None:
        said = elsewhere[0] + (f" {elsewhere[1]}" if elsewhere[1] else "")
        meant = scope[0] + (f" {scope[1]}" if scope[1] else "")
        return f"matching reason but scope {said}, not {meant}"
    if hard:
        return f"matching reason but not failed/Unhealthy in time (reached {', '.join(sorted(states)) or '-'})"
    return "never flagged in time"  # pragma: no cover - a non-ok state with a wanted reason is a match


def _is_workload_trap(trap: Any) -> bool:
    return (
        isinstance(trap, dict)
        and trap.get("kind") in WORKLOAD_TRAP_KINDS
        and isinstance(trap.get("k8s.node.name"), str)
    )


def _workload_watch(
    labels: dict[str, Any], node_devices: Mapping[str, list[tuple[str, str]]]
) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """The GPUs of each workload trap, and when they are watched: from the trap's time to WORKLOAD_WATCH_S
    after its last crash."""
    out: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for trap in labels.get("traps", []):
        if not _is_workload_trap(trap) or label_time(trap.get("at_unix_nano")) is None:
            continue
        node = trap["k8s.node.name"]
        detail = trap.get("detail") if isinstance(trap.get("detail"), dict) else {}
        start = label_time(trap["at_unix_nano"]) or 0
        times = [t for t in (label_time(x) for x in detail.get("crashes_unix_nano") or []) if t is not None]
        last = max([start, *times, label_time(detail.get("to_unix_nano")) or start])
        ids = detail.get("hw.ids")
        keys = [(node, i) for i in ids if isinstance(i, str)] if isinstance(ids, list) else node_devices.get(node, [])
        for key in keys:
            out[key].append((start, last + WORKLOAD_WATCH_S * 10**9))
    return out


def score_files(labels_path: Path | str, verdicts_path: Path | str) -> Score:
    """Score a verdict file against a labels file. ``LabelsError`` for bad labels, ``OSError`` for a
    verdict file that can't be read."""
    labels = load_labels(labels_path)
    return score(labels, read_verdict_lines(verdicts_path))
