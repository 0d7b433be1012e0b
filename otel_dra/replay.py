"""Replay: recorded OTLP JSON telemetry → the classifier → verdict lines (README, "Replay recorded telemetry").

Files are streamed: each line is decoded into frames (bad lines and points are skipped and counted, never
fatal; in a child process where a second core is there, :mod:`otel_dra.decode.stage`) and queued; every few
seconds of the recording's own clock (read off the nodes' clocks with their offsets taken out by the decode
stage: :class:`~otel_dra.decode.clock.TraceClock`), the queue is ingested as one batch and the classifier
evaluates, as a fleet would have live. A verdict line is written whenever a device's verdict changes, and not
kept: what a replay holds is the classifier's state, each device's last outcome for the summary (one shared
tuple per distinct outcome), and the timeline of every change only when a plot asks for it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from otel_dra.classifier import Classifier
from otel_dra.classifier.batch import Batch
from otel_dra.config import FleetConfig
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.result import DecodeError
from otel_dra.decode.stage import DecodeStage, Step
from otel_dra.frame import Schema
from otel_dra.policy import Policy
from otel_dra.words import plural

#: How many decode errors are shown on stderr (all are counted).
SHOWN_ERRORS = 5


#: A verdict's outcome as the summary counts it: (health, hw.state, reasons).
Outcome = tuple[str, str | None, tuple[str, ...]]


@dataclass
class ReplayResult:
    """What a replay did: counts for the summary, the errors, the final verdicts, a timeline."""

    lines: int = 0
    lines_skipped: int = 0
    points: int = 0
    points_skipped: int = 0
    #: Of the points skipped, those refused by a cap (limits.py), by reason.
    limited: Counter[str] = field(default_factory=Counter)
    frames: int = 0
    evaluations: int = 0
    verdict_lines: int = 0
    errors: list[DecodeError] = field(default_factory=list)
    error_count: int = 0
    #: Per device, its last verdict's outcome: (health, hw.state, reasons), one tuple for each distinct one.
    final: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    #: Per device, each verdict change: (time, health, hw.state, reasons); kept only when asked (a plot).
    timeline: dict[tuple[str, str], list[tuple[int, str, str | None, tuple[str, ...]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    interval_s: float = 0.0
    first_time_ns: int = 0
    last_time_ns: int = 0

    @property
    def usable(self) -> bool:
        return self.frames > 0


#: The shortest sampling interval a replay judges over a whole window (it sizes the window's
#: ring); a node sampled faster is judged over its last ``window / RING_INTERVAL_S`` samples.
RING_INTERVAL_S = 5.0


def replay(
    paths: list[Path],
    policy: Policy,
    out: IO[str],
    progress: Callable[[int], None] | None = None,
    evaluate_every_s: float = FleetConfig.evaluate_every_s,
    limits: DecodeLimits | None = None,
    timeline: bool = False,
    decode_process: bool | None = None,
) -> ReplayResult:
    """Stream ``paths`` through the classifier, evaluating every ``evaluate_every_s`` of the
    recording's clock (:class:`~otel_dra.decode.clock.TraceClock`); write changed verdicts to ``out``.

    Decoded frames are ingested in batches, once per evaluation, and dropped: a replay costs
    O(samples), and holds the classifier's state, not the recording, nor the verdicts it wrote
    (``timeline``: keep every change, for :func:`~otel_dra.replay_plot.plot_timeline`). Verdict times are each
    device's own node's time (the input's time base), so they line up with its samples. ``limits``:
    the caps on what the input may create, as the fleet's receiver has them (skipped and counted).
    ``decode_process``: decode in a child process, beside the judging (None: where a second core is there
    and the input is large enough to pay for it; :class:`~otel_dra.decode.stage.DecodeStage`)."""
    result = ReplayResult()
    schema = Schema()
    every_ns = round(evaluate_every_s * 1e9)
    stage = DecodeStage(paths, schema, limits or DecodeLimits(), process=decode_process, evaluate_every_ns=every_ns)
    # Built at the first evaluation, not here: a decode process starts at the first step asked for, and the
    # classifier's policy is compiled beside its first lines (the slow ones), not before it starts.
    made: list[Classifier] = []
    pending: list[Step] = []  # the steps since the last evaluation that brought samples
    now = 0  # the recording's clock after the last line read
    outcomes: dict[Outcome, Outcome] = {}

    def judge(now_ns: int) -> Classifier:
        if not made:
            made.append(Classifier(policy, schema, interval_s=RING_INTERVAL_S, node_time=True))
        classifier = made[0]
        if pending:
            classifier.ingest_batch(_batch_of(pending, len(schema)))
            pending.clear()
        for verdict in classifier.evaluate(now_ns):
            out.write(json.dumps(verdict.to_json(), separators=(", ", ": ")) + "\n")
            key = (verdict.node, verdict.hw_id)
            outcome: Outcome = (verdict.health, verdict.state, verdict.reasons)
            result.final[key] = outcomes.setdefault(outcome, outcome)
            if timeline:
                result.timeline[key].append((verdict.time_unix_nano, *outcome))
            result.verdict_lines += 1
            result.first_time_ns = min(result.first_time_ns or verdict.time_unix_nano, verdict.time_unix_nano)
        result.evaluations += 1
        return classifier

    # Each step is the lines up to one the grid evaluates after (or a few dozen lines), decoded: the decode stage
    # reads the recording's clock and cuts the steps (DecodeStage, Grid), in this process or in its child.
    with closing(stage.steps()) as steps:  # (a decode process is stopped however the loop ends)
        for step in steps:
            if step.limited:
                result.limited.update(step.limited)
            if step.errors:
                result.error_count += len(step.errors)
                room = SHOWN_ERRORS - len(result.errors)
                if room > 0:
                    result.errors.extend(step.errors[:room])
            if step.frames:
                now = step.now_ns
                result.frames += step.frames
                if step.tables:
                    pending.append(step)
            if step.evaluate:
                judge(now)
            if progress is not None:
                progress(step.size)
            del step  # (nothing of it held while the next is decoded: only its samples, in ``pending``)
    if result.frames:
        classifier = judge(now)
        result.last_time_ns = now
        intervals = classifier.intervals(np.flatnonzero(classifier.registry.active))
        intervals = intervals[~np.isnan(intervals)]
        result.interval_s = float(np.median(intervals)) if intervals.size else evaluate_every_s
    totals = stage.totals
    result.lines, result.lines_skipped = totals.lines, totals.lines_skipped
    result.points, result.points_skipped = totals.points, totals.points_skipped
    return result


def _batch_of(steps: list[Step], ncols: int) -> Batch | None:
    """The batch of the steps' frames (those with samples), one evaluation's: the step's own where it is one (the
    usual: one step an evaluation), made beside the decoding (:class:`~otel_dra.decode.stage.Step`)."""
    if len(steps) == 1 and (batch := steps[0].batch) is not None and batch.values.shape[1] == ncols:
        return batch
    return Batch.of_parts(
        [t for s in steps for t in s.tables],
        [t for s in steps for t in s.stamps],
        [n for s in steps for n in s.sizes],
        [h for s in steps for h in s.heard],
        [s.values for s in steps],
        ncols,
    )


def skip_summary(result: ReplayResult) -> str:
    """What was skipped, in one line: lines, points and, of the points, those the caps refused by reason."""
    refused = ", ".join(f"{reason} {n}" for reason, n in result.limited.items())
    by_cap = f" (refused by caps: {refused})" if refused else ""
    lines, points = plural(result.lines_skipped, "line"), plural(result.points_skipped, "point")
    return f"skipped: {lines}, {points}{by_cap}"


def summary_rows(result: ReplayResult) -> list[tuple[str, str, int]]:
    """(health, state, devices) and (reason, -, devices) counts over the final verdicts."""
    states = Counter((health, state or "-") for health, state, _ in result.final.values())
    reasons = Counter(r for _, _, why in result.final.values() for r in why)
    rows = [(health, state, n) for (health, state), n in sorted(states.items())]
    rows += [(f"reason: {reason}", "", n) for reason, n in sorted(reasons.items())]
    return rows
