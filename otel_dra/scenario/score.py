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
- False positives are also split by health (``fp_unhealthy_episodes``: the episode reached
  Unhealthy; ``fp_degraded_episodes``: degraded or predicted_failure only) and by reason
  (``fp_by_reason``, ``fp_unhealthy_by_reason``: an episode counts once for each reason it carried).
"""

from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from otel_dra.classifier.verdict import Verdict, VerdictInputError

NON_OK_STATES: Final = frozenset({"degraded", "predicted_failure", "failed"})
HEALTH: Final = frozenset({"Healthy", "Unhealthy", "Unknown"})
#: Unknown is excused on the silent node until this long after the silence ends.
UNKNOWN_GRACE_S: Final = 300
#: The silent node's devices must read Unknown this long after the silence starts.
SILENT_PROBE_S: Final = 150
LOST_KINDS: Final = frozenset({"device_lost", "fell_off_bus"})
EXAMPLES: Final = 10
#: Trap kinds a job's crash leaves (its GPUs must not be called faulty for it), and how long after the last
#: crash they are watched.
WORKLOAD_TRAP_KINDS: Final = frozenset({"job_crash", "crash_loop"})
WORKLOAD_WATCH_S: Final = 3600
DEVICE_SCOPE: Final = "device"

# Targets (see passes()).
SOFT_TARGET: Final = 0.95
FP_TARGET: Final = 0.3
EXTRA_TARGET: Final = 0.1


class LabelsError(ValueError):
    """Labels that can't be scored against; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class _Line:
    t: int
    health: str
    state: str | None
    reasons: frozenset[str]
    scope: str = DEVICE_SCOPE
    group: str | None = None

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


@dataclass(frozen=True)
class Target:
    """One target: what it measures, the figure, the goal, and whether it was met."""

    name: str
    figure: str
    goal: str
    met: bool


@dataclass
class Score:
    """The figures of one scoring (``to_json`` for machines, ``targets`` for the verdict)."""

    hard_total: int = 0
    hard_detected: int = 0  # failed/Unhealthy with a matching reason within the deadline
    hard_missed: list[dict[str, Any]] = field(default_factory=list)  # kind, device, why
    soft_total: int = 0
    soft_detected: int = 0  # non-ok with a matching reason within the deadline
    soft_missed: list[dict[str, Any]] = field(default_factory=list)
    median_delay_s: dict[str, float | None] = field(default_factory=dict)  # hard, soft: from onset to the hit
    median_delay_by_kind_s: dict[str, float] = field(default_factory=dict)
    fp_episodes: int = 0  # non-ok episodes outside every fault window of their device
    device_hours: float = 0.0  # labelled devices x the recording's length
    fp_per_100_device_hours: float = 0.0
    fp_by_trap: dict[str, int] = field(default_factory=dict)  # per trap kind of the device ("none"); an
    # episode on a device with two trap kinds counts for both
    fp_examples: list[dict[str, Any]] = field(default_factory=list)
    fp_unhealthy_episodes: int = 0  # of fp_episodes: reached Unhealthy
    fp_degraded_episodes: int = 0  # of fp_episodes: degraded or predicted_failure only
    fp_unhealthy_per_100_device_hours: float = 0.0
    fp_degraded_per_100_device_hours: float = 0.0
    fp_by_reason: dict[str, int] = field(default_factory=dict)  # reason -> episodes carrying it
    fp_unhealthy_by_reason: dict[str, int] = field(default_factory=dict)
    workload_traps: int = 0  # job_crash and crash_loop traps in the labels
    workload_trap_devices: int = 0  # the GPUs they held
    workload_device_scoped_episodes: int = 0  # non-ok device-scoped episodes there, outside fault windows
    workload_device_scoped_devices: int = 0
    workload_scoped_episodes: int = 0  # episodes there of another scope (workload): right, not false
    workload_examples: list[dict[str, Any]] = field(default_factory=list)
    intermittent_faults: int = 0
    extra_episodes_per_intermittent: float = 0.0  # mean over intermittent faults of (episodes after onset - 1)
    extra_episodes_per_fault: float = 0.0  # the same over every fault
    spurious_unknown_devices: int = 0
    spurious_unknown_episodes: int = 0  # runs of Unknown outside the silent node's and lost devices' excuses
    final_unknown_devices: int = 0  # of those, devices whose last verdict is such an Unknown
    spurious_unknown_examples: list[dict[str, Any]] = field(default_factory=list)
    silent_node: str | None = None
    silent_node_devices: int = 0
    silent_node_unknown: int = 0  # Unknown SILENT_PROBE_S after the silence starts
    silent_node_unhealthy: int = 0  # devices Unhealthy at any time during the silence
    verdict_lines: int = 0
    bad_lines: int = 0  # not JSON, or not a verdict line (missing key, unknown health)
    devices_total: int = 0
    devices_with_verdicts: int = 0
    unlabelled_devices: int = 0  # verdicts for devices the labels don't list (their episodes are false)

    @property
    def soft_fraction(self) -> float:
        return self.soft_detected / self.soft_total if self.soft_total else 1.0

    def targets(self) -> list[Target]:
        """Every target, met or not (``passes`` lists the missed ones)."""
        silent = (
            Target("silent node: Unknown, never Unhealthy", "no silent node labelled", "all Unknown, 0 Unhealthy", True)
            if self.silent_node is None
            else Target(
                "silent node: Unknown, never Unhealthy",
                f"{self.silent_node_unknown}/{self.silent_node_devices} Unknown after {SILENT_PROBE_S} s, "
                f"{self.silent_node_unhealthy} Unhealthy",
                "all Unknown, 0 Unhealthy",
                self.silent_node_unknown == self.silent_node_devices and self.silent_node_unhealthy == 0,
            )
        )
        return [
            Target(
                "hard faults failed in time",
                f"{self.hard_detected}/{self.hard_total}",
                "all",
                self.hard_detected == self.hard_total,
            ),
            Target(
                "soft faults flagged in time",
                f"{self.soft_detected}/{self.soft_total} ({100 * self.soft_fraction:.1f}%)",
                f">= {100 * SOFT_TARGET:.0f}%",
                self.soft_fraction >= SOFT_TARGET,
            ),
            Target(
                "false-positive episodes per 100 device-hours",
                f"{self.fp_per_100_device_hours:.2f} ({self.fp_episodes} episodes in {self.device_hours:.0f} h)",
                f"<= {FP_TARGET}",
                self.fp_per_100_device_hours <= FP_TARGET,
            ),
            Target(
                "extra episodes per intermittent fault",
                f"{self.extra_episodes_per_intermittent:.2f} ({self.intermittent_faults} faults)",
                f"<= {EXTRA_TARGET}",
                self.extra_episodes_per_intermittent <= EXTRA_TARGET,
            ),
            Target(
                "spurious Unknown",
                f"{self.spurious_unknown_devices} devices, {self.spurious_unknown_episodes} episodes, "
                f"{self.final_unknown_devices} at the end",
                "0",
                self.spurious_unknown_episodes == 0 and self.final_unknown_devices == 0,
            ),
            silent,
            *(
                [
                    Target(
                        "workload traps with a device-scoped non-ok verdict",
                        f"{self.workload_device_scoped_episodes} episodes on {self.workload_device_scoped_devices} "
                        f"of {self.workload_trap_devices} GPUs ({self.workload_traps} crashed jobs)",
                        "0",
                        self.workload_device_scoped_episodes == 0,
                    )
                ]
                if self.workload_traps
                else []
            ),
        ]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["soft_fraction"] = round(self.soft_fraction, 4)
        doc["targets"] = [asdict(t) for t in self.targets()]
        doc["passed"] = not passes(self)
        return doc


def passes(score: Score) -> list[str]:
    """The targets ``score`` misses, one line each (empty: every target met)."""
    return [f"{t.name}: {t.figure} (target {t.goal})" for t in score.targets() if not t.met]


# -- input -----------------------------------------------------------------------------------------
def _int(value: Any) -> int | None:
    """A label's time: an integer, a whole float or a string of digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _require(doc: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise LabelsError(f"{where} has no {key!r}")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise LabelsError(f"{where} {key!r} is {type(value).__name__} {_short(value)}, not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {"int": "an integer", "float": "a number", "str": "a string", "list": "a list"}.get(k.__name__, k.__name__)
        for k in kinds
    )


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_labels(labels: Any) -> None:
    """Raise :class:`LabelsError` (one line) unless ``labels`` has what scoring reads."""
    if not isinstance(labels, dict):
        raise LabelsError(f"labels are a JSON {type(labels).__name__}, not an object")
    step = _require(labels, "interval_s", "labels", (int, float))
    if not step > 0:
        raise LabelsError(f"labels 'interval_s' must be more than 0, got {step}")
    _require(labels, "t0_unix_nano", "labels", int)
    if _require(labels, "ticks", "labels", int) < 1:
        raise LabelsError("labels 'ticks' must be at least 1")
    for i, f in enumerate(_require(labels, "faults", "labels", list)):
        where = f"labels faults[{i}]"
        if not isinstance(f, dict):
            raise LabelsError(f"{where} is not an object")
        for key in ("k8s.node.name", "hw.id", "kind"):
            _require(f, key, where, str)
        reasons = _require(f, "reasons", where, list)
        if not reasons or not all(isinstance(r, str) for r in reasons):
            raise LabelsError(f"{where} 'reasons' must be a non-empty list of strings")
        if _require(f, "severity", where, str) not in ("hard", "soft"):
            raise LabelsError(f"{where} 'severity' must be hard or soft, got {_short(f['severity'])}")
        if _require(f, "deadline_s", where, (int, float)) < 0:
            raise LabelsError(f"{where} 'deadline_s' must be 0 or more")
        _require(f, "onset_unix_nano", where, int)
        if "end_unix_nano" in f and f["end_unix_nano"] is not None:
            _require(f, "end_unix_nano", where, int)
        for key in ("scope", "group"):
            if f.get(key) is not None:
                _require(f, key, where, str)
    devices = _require(labels, "devices", "labels", list)
    if not devices:
        raise LabelsError("labels 'devices' is empty: nothing to score")
    for i, d in enumerate(devices):
        if not isinstance(d, dict):
            raise LabelsError(f"labels devices[{i}] is not an object")
        _require(d, "k8s.node.name", f"labels devices[{i}]", str)
        _require(d, "hw.id", f"labels devices[{i}]", str)
    silence = labels.get("node_silence")
    if silence is not None:
        if not isinstance(silence, dict):
            raise LabelsError("labels 'node_silence' is not an object")
        _require(silence, "node", "labels node_silence", str)
        _require(silence, "from_unix_nano", "labels node_silence", int)
        _require(silence, "to_unix_nano", "labels node_silence", int)
    for key in ("traps", "nodes"):
        if not isinstance(labels.get(key, []), list):
            raise LabelsError(f"labels {key!r} is not a list")


def load_labels(path: Path | str) -> dict[str, Any]:
    """Read and check a labels file; :class:`LabelsError` (one line, naming the file) if it can't be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise LabelsError(f"{path}: not UTF-8 text") from None
    try:
        labels = json.loads(text)
    except ValueError as exc:
        raise LabelsError(f"{path}: not JSON ({exc})") from None
    try:
        check_labels(labels)
    except LabelsError as exc:
        raise LabelsError(f"{path}: {exc}") from None
    return labels


def read_verdict_lines(path: Path | str) -> Iterator[Any]:
    """Each non-empty line of a verdict file, parsed (``None`` for a line that isn't JSON).

    Raises ``OSError`` when the file can't be opened or read.
    """
    with Path(path).open("rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                yield json.loads(raw)
            except ValueError:
                yield None


# -- scoring ---------------------------------------------------------------------------------------
def _parse(line: Any, number: int) -> tuple[tuple[str, str], _Line] | None:
    try:
        v = Verdict.from_json(line, f"verdict line {number}", timed=True)
    except VerdictInputError:
        return None
    return (v.node, v.hw_id), _Line(v.time_unix_nano, v.health, v.state, frozenset(v.reasons), v.scope, v.group)


def _overlaps(ep: _Episode, lo: float, hi: float) -> bool:
    return ep.stop > lo and ep.start < hi


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
    end = t0 + int(labels["ticks"]) * step
    skew = {
        n["k8s.node.name"]: round(float(n.get("skew_s") or 0) * 1e9)
        for n in labels.get("nodes", [])
        if isinstance(n, dict) and isinstance(n.get("k8s.node.name"), str)
    }
    devices = [(d["k8s.node.name"], d["hw.id"]) for d in labels["devices"]]
    labelled = set(devices)
    out.devices_total = len(labelled)
    out.devices_with_verdicts = sum(1 for key in labelled if by_dev.get(key))
    out.unlabelled_devices = sum(1 for key in by_dev if key not in labelled)

    faults_of: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for f in labels["faults"]:
        faults_of[(f["k8s.node.name"], f["hw.id"])].append(f)

    # Faults: caught in time, with a matching reason (and failed, for hard ones)?
    delays: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[str, list[float]] = defaultdict(list)
    extra_all: list[int] = []
    extra_int: list[int] = []
    for f in labels["faults"]:
        key = (f["k8s.node.name"], f["hw.id"])
        seq = by_dev.get(key, [])
        hard = f["severity"] == "hard"
        onset = int(f["onset_unix_nano"])
        lo, hi = onset - step, onset + round(float(f["deadline_s"]) * 1e9)
        wanted = set(f["reasons"])
        scope = (f["scope"], f.get("group")) if f.get("scope") is not None else None
        hit, seen, states, late, elsewhere = _detect(seq, lo, hi, wanted, hard, scope)
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

    # False positives: episodes outside every fault window of their device.
    traps_of: dict[tuple[str, str], list[str]] = defaultdict(list)
    node_devices: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in devices:
        node_devices[key[0]].append(key)
    for trap in labels.get("traps", []):
        if not isinstance(trap, dict) or not isinstance(trap.get("k8s.node.name"), str):
            continue
        kind = str(trap.get("kind", "trap"))
        if isinstance(trap.get("hw.id"), str):
            traps_of[(trap["k8s.node.name"], trap["hw.id"])].append(kind)
        else:
            for key in node_devices.get(trap["k8s.node.name"], []):
                traps_of[key].append(kind)
    fp_by_trap: dict[str, int] = defaultdict(int)
    fp_by_reason: dict[str, int] = defaultdict(int)
    fp_unhealthy_by_reason: dict[str, int] = defaultdict(int)
    watched = _workload_watch(labels, node_devices)
    out.workload_traps = sum(1 for t in labels.get("traps", []) if _is_workload_trap(t))
    out.workload_trap_devices = len(watched)
    device_scoped: set[tuple[str, str]] = set()
    for key, seq in sorted(by_dev.items()):
        windows = []
        for f in faults_of.get(key, []):
            onset = int(f["onset_unix_nano"])
            stop: float = math.inf
            if f.get("end_unix_nano") is not None:
                stop = int(f["end_unix_nano"]) + round(float(f["deadline_s"]) * 1e9)
            windows.append((onset - step, stop))
        for ep in _episodes(seq):
            if any(_overlaps(ep, lo, hi) for lo, hi in windows):
                continue
            watch = [(lo, hi) for lo, hi in watched.get(key, []) if _overlaps(ep, lo, hi)]
            if watch and not ep.device_spans:  # another scope (the workload's) all along: the right answer
                out.workload_scoped_episodes += 1
                continue
            if any(b > lo and a < hi for a, b in ep.device_spans for lo, hi in watch):
                out.workload_device_scoped_episodes += 1
                device_scoped.add(key)
                if len(out.workload_examples) < EXAMPLES:
                    out.workload_examples.append(
                        {
                            "k8s.node.name": key[0],
                            "hw.id": key[1],
                            "reasons": sorted(ep.reasons),
                            "states": sorted(ep.states),
                            "from_s": round((ep.start - t0) / 1e9, 1),
                        }
                    )
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
                out.fp_examples.append(
                    {
                        "k8s.node.name": key[0],
                        "hw.id": key[1],
                        "reasons": sorted(ep.reasons),
                        "states": sorted(ep.states),
                        "from_s": round((ep.start - t0) / 1e9, 1),
                        "traps": kinds,
                    }
                )
    out.fp_by_trap = dict(sorted(fp_by_trap.items()))
    out.fp_by_reason = dict(sorted(fp_by_reason.items()))
    out.fp_unhealthy_by_reason = dict(sorted(fp_unhealthy_by_reason.items()))
    out.workload_device_scoped_devices = len(device_scoped)
    out.device_hours = round(len(devices) * (end - t0) / 3.6e12, 3)
    hours = out.device_hours
    out.fp_per_100_device_hours = round(100 * out.fp_episodes / hours, 3) if hours else 0.0
    out.fp_unhealthy_per_100_device_hours = round(100 * out.fp_unhealthy_episodes / hours, 3) if hours else 0.0
    out.fp_degraded_per_100_device_hours = round(100 * out.fp_degraded_episodes / hours, 3) if hours else 0.0

    # Unknown: only the silent node (during its silence and a grace after) and lost devices may read it.
    silence = labels.get("node_silence")
    excuses: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    if silence is not None:
        lo, hi = int(silence["from_unix_nano"]), int(silence["to_unix_nano"]) + UNKNOWN_GRACE_S * 10**9
        for key in node_devices.get(silence["node"], []):
            excuses[key].append((lo, hi))
    for f in labels["faults"]:
        if f.get("lost") or f["kind"] in LOST_KINDS:
            excuses[(f["k8s.node.name"], f["hw.id"])].append((int(f["onset_unix_nano"]) - step, math.inf))
    spurious_devices = set()
    for key, seq in sorted(by_dev.items()):
        node_end = end + skew.get(key[0], 0)
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
                        "from_s": round((run.start - t0) / 1e9, 1),
                        "to_s": None if run.stop == math.inf else round((run.stop - t0) / 1e9, 1),
                    }
                )
    out.spurious_unknown_devices = len(spurious_devices)

    if silence is not None:
        out.silent_node = silence["node"]
        lo, hi = int(silence["from_unix_nano"]), int(silence["to_unix_nano"])
        probe = lo + SILENT_PROBE_S * 10**9
        for key in node_devices.get(silence["node"], []):
            seq = by_dev.get(key, [])
            times = [v.t for v in seq]
            out.silent_node_devices += 1
            at = bisect_right(times, probe) - 1
            out.silent_node_unknown += int(at >= 0 and seq[at].health == "Unknown")
            first = bisect_right(times, lo) - 1
            span = seq[max(first, 0) : bisect_right(times, hi)]
            out.silent_node_unhealthy += int(any(v.health == "Unhealthy" for v in span))
    return out


def _detect(
    seq: list[_Line], lo: int, hi: int, wanted: set[str], hard: bool, scope: tuple[str, str | None] | None = None
) -> tuple[int | None, set[str], set[str], int | None, tuple[str, str | None] | None]:
    """When in [lo, hi] the state first matches (None: never); the reasons and states seen non-ok in
    there; for a miss, when it first matched after ``hi`` (None: never); and, for a fault with a
    ``scope`` (scope, group), the first (scope, group) a line with the right reason and state said
    instead in [lo, hi] (None: none did)."""
    times = [v.t for v in seq]
    start = max(bisect_right(times, lo) - 1, 0)  # the line whose state holds at lo, if any
    seen: set[str] = set()
    states: set[str] = set()
    elsewhere: tuple[str, str | None] | None = None
    for v in seq[start:]:
        at = max(v.t, lo)
        right = v.non_ok and bool(v.reasons & wanted) and (v.failing or not hard)
        match = right and (scope is None or (v.scope, v.group) == scope)
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
        if not _is_workload_trap(trap) or _int(trap.get("at_unix_nano")) is None:
            continue
        node = trap["k8s.node.name"]
        detail = trap.get("detail") if isinstance(trap.get("detail"), dict) else {}
        start = _int(trap["at_unix_nano"]) or 0
        times = [t for t in (_int(x) for x in detail.get("crashes_unix_nano") or []) if t is not None]
        last = max([start, *times, _int(detail.get("to_unix_nano")) or start])
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
