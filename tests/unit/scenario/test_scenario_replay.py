"""The classifier on generated messy fleets: replay, then score against the labels (issue #11).

CI runs the short form (12 nodes x 4 GPUs x 50 minutes: every fault kind, trap and oddity at
least once) on two seeds; the long form over several seeds is ``bench/bench_replay.py``'s, its
table in BENCHMARKS.md. The targets are the scorer's own (``otel_dra.scenario.passes``)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from otel_dra import policy as policy_mod
from otel_dra.replay import replay
from otel_dra.scenario import form, passes, run
from otel_dra.scenario.score import score_files


@pytest.mark.parametrize("seed", [1, 2])
def test_a_generated_messy_fleet_meets_every_target(tmp_path: Path, seed: int) -> None:
    recording, labels = run(form("short", seed=seed), tmp_path)
    verdicts = tmp_path / "verdicts.jsonl"
    with verdicts.open("w") as out:
        result = replay([recording], policy_mod.load(), out)
    assert result.points_skipped == 0 and result.lines_skipped == 0
    score = score_files(labels, verdicts)
    assert passes(score) == [], score.to_json()


def test_replay_evaluates_on_a_cadence_not_per_line(tmp_path: Path) -> None:
    """O(samples): a replay of a 50-minute recording evaluates at most every 5 s of its clock,
    not once per line (the recording has thousands of lines, from nodes 5 to 60 s apart), and
    at least every 10 s (the clock moves with the nodes' lines, a few seconds at a time)."""
    recording, _ = run(form("short", seed=3), tmp_path)
    result = replay([recording], policy_mod.load(), io.StringIO())
    minutes = (result.last_time_ns - result.first_time_ns) / 60e9
    assert result.lines > 2000
    assert minutes * 6 <= result.evaluations <= minutes * 12 + 2
