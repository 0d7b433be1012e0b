"""Firmware versions judged across the fleet: per model, each version's rate of fatal events against the others'.

A firmware version that makes a model fall off the bus three times as often as the next version is invisible
device by device: each of its devices fails rarely, and each failure looks like the device's own. Counted over
days per (model, version) it shows. Each device's fatal episodes are counted once (a fatal driver error, an
uncorrected ECC error, a lost device, recurring resets), when the device's own: an episode is settled over the
evidence window after it began (the window in which its neighbours' evidence makes it a switch's, a fabric's or
a node's, which says nothing of the firmware), and counted then unless it was found shared. Beside the events,
each version's exposure in device-seconds; both in buckets over the policy's horizon (``scopes.firmware``), kept
in the state file across restarts.

The test is on counts, not on a ratio of small numbers: under equal rates, a version's share of its model's
events is binomial with its share of the exposure, so the chance of it having at least its events by luck is a
binomial tail. A version is named when that tail is under ``significance`` (divided by the versions tested: many
versions tested at once find one by luck otherwise), with at least ``min_events`` events on at least
``min_devices`` of its devices (one device failing again and again is that device's fault), ``min_device_days``
of exposure on each side, and at least ``min_ratio`` times the others' rate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from otel_dra.classifier.layout import DEVICE, FAILED, R
from otel_dra.classifier.numeric import any_of, flatnonzero
from otel_dra.classifier.registry import grown_rows
from otel_dra.classifier.topology import GroupNames
from otel_dra.policy import FirmwareScope
from otel_dra.words import human_duration

DAY_S = 86400.0
#: Reasons whose device-scoped episodes are fatal events (failed, or resets recurring).
FATAL_REASONS = np.asarray([R["memory_ecc"], R["driver_errors"], R["device_lost"], R["device_reset"]])
_ALWAYS = np.asarray([False, False, True, True])  # counted whatever the state (device_lost fails; resets degrade)
#: The longest gap between two evaluations credited as exposure (a paused fleet did not watch its devices).
MAX_STEP_S = 300.0
#: The most firmware versions counted (each holds a row of buckets over the horizon: 720 of an hour in 30 days).
MAX_VERSIONS = 4096


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (n is a count of events: small)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    terms = [base - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * lp + (n - x) * lq for x in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def per_thousand_days(events: float, seconds: float) -> float:
    return 1000.0 * events / (seconds / DAY_S) if seconds > 0 else 0.0


class FirmwareRates:
    """Per firmware version (a group code of :class:`~otel_dra.classifier.topology.GroupNames`, given a dense
    index here: ``index_of``): exposure and fatal events in a ring of buckets; per row, its fatal episode: on at
    the last evaluation, since when it is being settled, and whether it was found shared meanwhile.
    ``settle_s``: how long an episode is watched before it counts. At most ``max_versions`` versions are counted
    (a sender rotating versions at every push must not grow the buckets for ever)."""

    def __init__(
        self,
        policy: FirmwareScope,
        names: GroupNames,
        capacity: int,
        settle_s: float = 300.0,
        max_versions: int = MAX_VERSIONS,
    ) -> None:
        self.policy = policy
        self.settle_s = settle_s
        self.names = names
        self.max_versions = max_versions
        self.n_buckets = max(1, math.ceil(policy.horizon_s / policy.bucket_s))
        self.bucket_of = np.full(self.n_buckets, -1, dtype=np.int64)  # the absolute bucket each slot holds
        #: Per group code: its version's index (-1: not a firmware version, or no room); per index, its code.
        self.index_of = np.full(1, -1, dtype=np.int64)
        self.code_of: list[int] = []
        self.exposure = np.zeros((0, self.n_buckets))  # device-seconds, by (index, slot)
        self.events = np.zeros((0, self.n_buckets))
        self.was_fatal = np.zeros(capacity, dtype=bool)
        self.settling_since = np.full(capacity, np.inf)
        self.shared = np.zeros(capacity, dtype=bool)
        self.struck_at = np.full(capacity, -np.inf)  # when the device's last counted event was
        #: Per index: named now; per group code, why (the evidence in words).
        self.flagged = np.zeros(0, dtype=bool)
        self.text: dict[int, str] = {}
        self.last_s = -math.inf
        self.tested_at = -math.inf

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.was_fatal = grown_rows(self.was_fatal, capacity, keep=keep)
        self.settling_since = grown_rows(self.settling_since, capacity, keep=keep)
        self.shared = grown_rows(self.shared, capacity, keep=keep)
        self.struck_at = grown_rows(self.struck_at, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.was_fatal[rows] = False
        self.settling_since[rows] = np.inf
        self.shared[rows] = False
        self.struck_at[rows] = -np.inf

    def _versions(self) -> None:
        """An index for each firmware version the names table has given since (while there is room)."""
        known = self.index_of.shape[0]
        n = len(self.names)
        if known >= n:
            return
        fresh = np.full(n - known, -1, dtype=np.int64)
        for i, code in enumerate(range(known, n)):
            if self.names.keys[code][:1] == ("firmware",) and len(self.code_of) < self.max_versions:
                fresh[i] = len(self.code_of)
                self.code_of.append(code)
        self.index_of = np.concatenate([self.index_of, fresh])
        grow = len(self.code_of) - self.exposure.shape[0]
        if grow:
            self.exposure = np.vstack([self.exposure, np.zeros((grow, self.n_buckets))])
            self.events = np.vstack([self.events, np.zeros((grow, self.n_buckets))])
            self.flagged = np.concatenate([self.flagged, np.zeros(grow, dtype=bool)])

    def named(self, codes: np.ndarray) -> np.ndarray:
        """Per firmware group code of ``codes``: the fleet's rates name it now."""
        self._versions()
        index = self.index_of[codes]
        return (index >= 0) & self.flagged[np.maximum(index, 0)] if self.flagged.size else np.zeros(codes.shape, bool)

    def _slot(self, now_s: float) -> int:
        bucket = int(now_s // self.policy.bucket_s)
        slot = bucket % self.n_buckets
        if self.bucket_of[slot] != bucket:
            self.bucket_of[slot] = bucket
            self.exposure[:, slot] = 0.0
            self.events[:, slot] = 0.0
        return slot

    def observe(
        self,
        rows: np.ndarray,
        now_s: float,
        codes: np.ndarray,
        known: np.ndarray,
        on: np.ndarray,
        state: np.ndarray,
        scope: np.ndarray,
    ) -> None:
        """One evaluation of ``rows`` at ``now_s``: each known device's time since the last one is exposure of its
        version (``codes``: group codes), and each fatal episode settled as the device's own is an event.
        ``on``/``state``/``scope``: the verdict engine's per (row, reason) arrays for ``rows``."""
        self._versions()
        step = min(max(now_s - self.last_s, 0.0), MAX_STEP_S) if math.isfinite(self.last_s) else 0.0
        self.last_s = now_s
        col = FATAL_REASONS
        held = on[:, col] & ((state[:, col] == FAILED) | _ALWAYS)
        fatal = np.logical_or.reduce(held, axis=1)
        began = fatal & ~self.was_fatal[rows]
        self.was_fatal[rows] = fatal
        since = np.where(began, now_s, self.settling_since[rows])
        shared = np.where(began, False, self.shared[rows]) | np.logical_or.reduce(
            held & (scope[:, col] != DEVICE), axis=1
        )
        settled = np.isfinite(since) & ((now_s - since >= self.settle_s) | ~fatal)
        counted = settled & ~shared
        self.settling_since[rows] = np.where(settled, np.inf, since)
        self.shared[rows] = shared & ~settled
        struck = np.where(counted, now_s, self.struck_at[rows])
        self.struck_at[rows] = struck
        n = len(self.code_of)
        if n == 0:
            return
        slot = self._slot(now_s)
        index = self.index_of[codes]
        versioned = index >= 0
        if step > 0:
            self.exposure[:, slot] += np.bincount(index[known & versioned], minlength=n) * step
        if any_of(counted):
            self.events[:, slot] += np.bincount(index[counted & versioned], minlength=n)
        if now_s - self.tested_at >= self.policy.every_s:
            self.tested_at = now_s
            recent = versioned & (struck > now_s - self.policy.horizon_s)
            self.test(now_s, np.bincount(index[versioned], minlength=n), np.bincount(index[recent], minlength=n))

    def totals(self, now_s: float) -> tuple[np.ndarray, np.ndarray, float]:
        """Per version index, exposure (device-seconds) and events within the horizon, and the span they cover."""
        bucket = int(now_s // self.policy.bucket_s)
        live = (self.bucket_of > bucket - self.n_buckets) & (self.bucket_of >= 0)
        exposure, events = self.exposure[:, live].sum(axis=1), self.events[:, live].sum(axis=1)
        first = self.bucket_of[live].min() if live.any() else bucket
        return exposure, events, max(now_s - first * self.policy.bucket_s, 0.0)

    def test(self, now_s: float, devices: np.ndarray, struck: np.ndarray) -> None:
        """Name the versions whose rate stands out from their model's other versions (module docstring).
        ``devices``: per version index, how many known devices run it now; ``struck``: how many of them had an
        event within the horizon (one faulty device failing again and again is that device's fault, not its
        firmware's)."""
        p = self.policy
        exposure, events, span = self.totals(now_s)
        n = exposure.shape[0]
        model_of = np.asarray([self.names.model_of[code] for code in self.code_of], dtype=np.int64)
        per_model_t = np.bincount(model_of, weights=exposure)
        per_model_k = np.bincount(model_of, weights=events)
        per_model_d = np.bincount(model_of, weights=devices)
        flagged = np.zeros(n, dtype=bool)
        text: dict[int, str] = {}
        least_s = p.min_device_days * DAY_S
        t1, k1 = exposure, events
        t0, k0 = per_model_t[model_of] - t1, per_model_k[model_of] - k1
        tested = flatnonzero((t1 >= least_s) & (t0 >= least_s))
        for i in tested.tolist():
            if k1[i] < p.min_events or struck[i] < p.min_devices or k1[i] / t1[i] < p.min_ratio * (k0[i] / t0[i]):
                continue
            tail = binomial_tail(int(k1[i]), int(k1[i] + k0[i]), t1[i] / (t1[i] + t0[i])) * max(1, tested.size)
            if tail >= p.significance:
                continue
            flagged[i] = True
            code = self.code_of[i]
            _, model, version = self.names.keys[code]
            others = int(per_model_d[model_of[i]] - devices[i])
            text[code] = (
                f"firmware {version} of {model}: {k1[i]:.0f} fatal events in {t1[i] / DAY_S:.1f} device-days "
                f"({per_thousand_days(k1[i], t1[i]):,.1f} per 1,000 device-days) against {k0[i]:.0f} in "
                f"{t0[i] / DAY_S:.1f} ({per_thousand_days(k0[i], t0[i]):,.1f}) on its other versions, "
                f"{int(devices[i])} and {others} devices ({int(struck[i])} of the {int(devices[i])} struck), over "
                f"{human_duration(span)} (chance of this by luck {tail:.2g})"
            )
        self.flagged, self.text = flagged, text

    # -- the state file ------------------------------------------------------------------------
    def history(self, now_s: float) -> FirmwareHistory:
        """The versions' buckets within the horizon, by model and version (codes are this process's)."""
        bucket = int(now_s // self.policy.bucket_s)
        live = flatnonzero((self.bucket_of > bucket - self.n_buckets) & (self.bucket_of >= 0))
        versions = []
        for i, code in enumerate(self.code_of):
            _, model, version = self.names.keys[code]
            kept = [
                (int(self.bucket_of[s]), float(self.exposure[i, s]), float(self.events[i, s]))
                for s in live.tolist()
                if self.exposure[i, s] or self.events[i, s]
            ]
            if kept:
                versions.append((model, version, kept))
        return FirmwareHistory(self.policy.bucket_s, versions)

    def recall(self, doc: FirmwareHistory, now_s: float) -> None:
        """Take back what :meth:`history` gave (a previous process's), where it still falls within the horizon and
        uses this policy's bucket."""
        if doc.bucket_s != self.policy.bucket_s:
            return
        bucket = int(now_s // self.policy.bucket_s)
        for model, version, buckets in doc.versions:
            code = self.names.firmware_code(model, version)
            self._versions()
            i = int(self.index_of[code]) if code else -1
            if i < 0:
                continue
            for b, exposure, events in buckets:
                if bucket - self.n_buckets < b <= bucket:
                    slot = self._slot(b * self.policy.bucket_s)
                    self.exposure[i, slot] += exposure
                    self.events[i, slot] += events


class FirmwareHistory:
    """The firmware rates' part of a state file, checked whole: :meth:`from_json` accepts what :meth:`to_json`
    writes and raises ``ValueError`` on anything else."""

    def __init__(self, bucket_s: float, versions: list[tuple[str, str, list[tuple[int, float, float]]]]) -> None:
        self.bucket_s = bucket_s
        self.versions = versions

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket_s": self.bucket_s,
            "versions": [
                {"model": model, "version": version, "buckets": [list(b) for b in buckets]}
                for model, version, buckets in self.versions
            ],
        }

    @classmethod
    def from_json(cls, doc: Any) -> FirmwareHistory:
        if not isinstance(doc, dict) or set(doc) != {"bucket_s", "versions"}:
            raise ValueError('expected {"bucket_s": ..., "versions": [...]}')
        bucket_s = doc["bucket_s"]
        if isinstance(bucket_s, bool) or not isinstance(bucket_s, int | float) or not bucket_s > 0:
            raise ValueError(f"bucket_s {bucket_s!r} is not a positive number")
        if not isinstance(doc["versions"], list):
            raise ValueError("versions is not a list")
        versions = []
        for i, v in enumerate(doc["versions"]):
            if not isinstance(v, dict) or set(v) != {"model", "version", "buckets"}:
                raise ValueError(f"versions[{i}]: expected model, version and buckets")
            if not all(isinstance(v[k], str) for k in ("model", "version")) or not isinstance(v["buckets"], list):
                raise ValueError(f"versions[{i}]: model and version are text, buckets a list")
            buckets = []
            for b in v["buckets"]:
                ok = isinstance(b, list) and len(b) == 3 and isinstance(b[0], int) and not isinstance(b[0], bool)
                if not ok or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in b[1:]):
                    raise ValueError(f"versions[{i}]: a bucket is [index, device-seconds, events]")
                if not (math.isfinite(b[1]) and math.isfinite(b[2]) and b[1] >= 0 and b[2] >= 0):
                    raise ValueError(f"versions[{i}]: a bucket's figures are finite and not negative")
                buckets.append((int(b[0]), float(b[1]), float(b[2])))
            versions.append((v["model"], v["version"], buckets))
        return cls(float(bucket_s), versions)
