"""The replay's decode stage: a child process decodes exactly what one process does, in order, and a
replay through it writes the same verdicts (issue #32: replay as fast as a backtest needs)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier.batch import Batch, rounds_of
from otel_dra.decode.clock import TraceClock
from otel_dra.decode.files import InputFileError, read_lines
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.stage import BATCH_LINES, DecodeStage, Step
from otel_dra.faults import Fault
from otel_dra.frame import Schema
from tests.support.otlp_trace import power_line, write_trace


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> list[Path]:
    """Two files: three nodes with faults (gzip), then lines that are bad or refused by the caps."""
    folder = tmp_path_factory.mktemp("stage")
    first = write_trace(
        folder / "a.jsonl.gz",
        {"node-a": (4, [Fault("gpu-1", "memory_ecc", 120)]), "node-b": (2, []), "node-c": (3, [])},
        400,
    )
    extra = ["{not json", power_line("Bad_Node", 3), power_line("big", 300), '{"resourceMetrics": 5}']
    second = write_trace(folder / "b.jsonl", {"node-d": (2, [])}, 100, extra_lines=extra)
    return [first, second]


@pytest.fixture(params=["fork", "exec"])
def start(request, monkeypatch) -> str:
    """How the child starts: a copy of this process, or a new interpreter (the default picks one; both are run)."""
    monkeypatch.setattr("otel_dra.decode.stage._start_for_here", lambda: request.param)
    return request.param


EVERY_NS = 5_000_000_000


def decoded(paths: list[Path], process: bool, **kw) -> tuple[list[Step], DecodeStage, Schema]:
    schema = Schema()
    stage = DecodeStage(paths, schema, DecodeLimits(), process=process, evaluate_every_ns=EVERY_NS, **kw)
    return list(stage.steps()), stage, schema


def frames_of(steps: list[Step], width: int) -> list[tuple[int, int, object, int, int, np.ndarray]]:
    """Each frame with samples as (evaluations before it, time, table, devices, heard, values widened to ``width``)."""
    out = []
    evaluations = 0
    for step in steps:
        at = 0
        for table, stamp, size, heard in zip(step.tables, step.stamps, step.sizes, step.heard, strict=True):
            rows = np.full((size, width), np.nan)
            rows[:, : step.values.shape[1]] = step.values[at : at + size]
            out.append((evaluations, stamp, table, size, heard, rows))
            at += size
        assert at == step.values.shape[0]
        evaluations += step.evaluate
    return out


def same_steps(a: list[Step], b: list[Step], width: int) -> None:
    """What the judge gets from either is the same: each evaluation's frames (its batch), where the evaluations are
    (after how many lines, at which clock), the errors, refusals and sizes (steps may be cut elsewhere: a child
    starting its tables' numbers over sends the lines before)."""

    def evaluations(steps: list[Step]) -> list[tuple[int, int]]:
        lines, out = 0, []
        for step in steps:
            lines += step.lines
            if step.evaluate:
                out.append((lines, step.now_ns))
        return out

    assert evaluations(a) == evaluations(b)
    assert [e for x in a for e in x.errors] == [e for y in b for e in y.errors]
    assert sum((Counter(x.limited) for x in a), Counter()) == sum((Counter(y.limited) for y in b), Counter())
    assert sum(x.size for x in a) == sum(y.size for y in b) and sum(x.frames for x in a) == sum(y.frames for y in b)
    fa, fb = frames_of(a, width), frames_of(b, width)
    assert len(fa) == len(fb)
    for f, g in zip(fa, fb, strict=True):
        assert f[:5] == g[:5]
        np.testing.assert_array_equal(f[5], g[5])


def table_sharing(steps: list[Step]) -> list[int]:
    """Each frame's table as the index of the first frame that held that very object."""
    first: dict[int, int] = {}
    tables = [t for step in steps for t in step.tables]
    return [first.setdefault(id(t), i) for i, t in enumerate(tables)]


def test_a_child_decodes_what_one_process_does_in_order_with_its_errors_counts_and_columns(recordings, start):
    here, stage_here, schema_here = decoded(recordings, process=False)
    there, stage_there, schema_there = decoded(recordings, process=True)
    assert [(x.lines, x.evaluate, x.now_ns) for x in here] == [(y.lines, y.evaluate, y.now_ns) for y in there]
    same_steps(here, there, len(schema_here))
    assert schema_there.columns == schema_here.columns
    assert stage_there.totals == stage_here.totals
    assert stage_here.totals.lines_skipped == 2 and stage_here.totals.points_skipped >= 3 + 44
    assert any(step.limited for step in there) and any(step.errors for step in there)
    # A table crosses once: the judge's side shares each table object as the decoder did.
    assert table_sharing(there) == table_sharing(here)
    assert len(set(table_sharing(there))) < sum(len(step.tables) for step in there)


def test_each_steps_batch_is_that_of_its_frames_made_beside_the_decoding(recordings, start):
    """A step that is an evaluation's samples alone carries them as the batch the judge ingests (made by the decode
    stage, in its process), the batch of its parts with the judge's side's tables, its rounds worked out; a step
    with samples before an evaluation's step carries none (the judge makes the batch of them all from their parts),
    nor does that evaluation's step."""
    for process in (False, True):
        steps, _, _ = decoded(recordings, process=process)
        alone, carried, several = True, 0, 0
        for step in steps:
            made = Batch.of_parts(step.tables, step.stamps, step.sizes, step.heard, [step.values], step.values.shape[1])
            whole = step.evaluate and alone
            alone = step.evaluate or (alone and made is None)
            if made is None or not whole:
                assert step.batch is None
                several += made is not None
                continue
            carried += 1
            ours = step.batch
            assert ours is not None and ours.rounds is not None
            assert all(a is b for a, b in zip(ours.tables, step.tables, strict=True))
            assert ours.sizes == made.sizes and ours.everyone == made.everyone
            for name in ("offsets", "values", "read", "times", "arrivals"):
                np.testing.assert_array_equal(getattr(ours, name), getattr(made, name))
        assert carried and several  # (both kinds of step in these recordings)


def test_device_numbers_start_over_between_steps_and_each_batch_keeps_its_rounds(recordings, monkeypatch):
    """Past its bound the steps' numbering of devices starts over, between steps: a batch's numbers still name one
    device each, so its rounds are those of its devices (by node and hw.id)."""
    monkeypatch.setattr("otel_dra.decode.stage.MAX_DEVICES", 3)
    steps, _, _ = decoded(recordings, process=False)
    checked = 0
    for step in steps:
        if step.batch is None:
            continue
        keys: dict[tuple[str, str], int] = {}
        devices = np.asarray([keys.setdefault((t.node, d), len(keys)) for t in step.tables for d in t.ids])
        read = devices[step.batch.read]
        expected = [] if len(step.tables) == 1 else rounds_of(read) or []
        assert [r.tolist() for r in step.batch.rounds or []] == [r.tolist() for r in expected]
        checked += len(step.tables) > 1
    assert checked


def test_steps_end_where_the_grid_evaluates_and_hold_a_few_dozen_lines_at_most(recordings):
    # The evaluations a replay made line by line (the clock after each line with frames, against a grid from the
    # first one's), made here from the steps.
    schema = Schema()
    decoder, clock = OtlpJsonDecoder(schema), TraceClock()
    expected, next_eval = [], None
    for number, (_path, lineno, raw) in enumerate(read_lines(recordings), 1):
        frames = decoder.decode(raw, lineno).frames
        if frames:
            now = clock.heard(frames)
            next_eval = now if next_eval is None else next_eval
            if now >= next_eval:
                expected.append((number, now))
                next_eval += EVERY_NS * ((now - next_eval) // EVERY_NS + 1)
    steps, _, _ = decoded(recordings, process=False)
    got, lines = [], 0
    for step in steps:
        lines += step.lines
        if step.evaluate:
            got.append((lines, step.now_ns))
    assert got == expected and len(expected) > 20
    assert max(step.lines for step in steps) <= BATCH_LINES


def test_past_its_table_cap_the_child_starts_numbering_over_and_frames_keep_their_tables(recordings, start):
    here, _, schema = decoded(recordings, process=False)
    there, _, _ = decoded(recordings, process=True, max_tables=2)  # four nodes' tables: it starts over, often
    same_steps(here, there, len(schema))


def test_a_file_cut_short_raises_after_the_lines_before_it_in_either_mode(recordings, tmp_path, start):
    whole = gzip.decompress(recordings[0].read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(whole)[: len(gzip.compress(whole)) // 2])
    seen: dict[bool, tuple[list[Step], str, int]] = {}
    for process in (False, True):
        schema = Schema()
        stage = DecodeStage([recordings[1], cut], schema, process=process, evaluate_every_ns=EVERY_NS)
        got: list[Step] = []
        with pytest.raises(InputFileError) as raised:
            for step in stage.steps():
                got.append(step)
        seen[process] = got, str(raised.value), len(schema)
    same_steps(seen[False][0], seen[True][0], seen[False][2])
    assert seen[False][1] == seen[True][1] and "cut.jsonl.gz: cannot read after line" in seen[True][1]
    assert sum(step.lines for step in seen[True][0]) > 11  # the whole first file, then the cut one's lines before


def test_a_replay_through_the_child_writes_the_same_verdicts(recordings, start):
    from otel_dra.policy import load
    from otel_dra.replay import replay

    outs = {}
    for process in (False, True):
        out = io.StringIO()
        result = replay(recordings, load(), out, decode_process=process)
        outs[process] = out.getvalue(), result.lines, result.points, result.points_skipped, dict(result.limited)
    assert outs[True] == outs[False]
    assert outs[True][0].count("\n") > 9


def test_a_schema_with_columns_is_refused_for_a_child(recordings):
    schema = Schema()
    DecodeStage(recordings, schema, process=False, evaluate_every_ns=EVERY_NS).steps().__next__()
    with pytest.raises(ValueError, match="new schema"):
        next(DecodeStage(recordings, schema, process=True, evaluate_every_ns=EVERY_NS).steps())


@pytest.mark.parametrize("how", ["fork", "exec"])
def test_a_script_without_a_main_guard_replays_once_and_its_unwritten_output_is_written_once(recordings, tmp_path, how):
    # (multiprocessing's spawn would import the script again in the child and run it twice, or refuse; a forked
    # child that flushed the text the script had printed but not yet written would write it a second time.)
    script = tmp_path / "backtest.py"
    script.write_text(
        "import io, sys, threading\n"
        "from otel_dra.decode.stage import _start_for_here\n"
        "from otel_dra.policy import load\n"
        "from otel_dra.replay import replay\n"
        "print('starting', flush=False)\n"
        f"if {how!r} == 'exec':  # another thread running: no fork\n"
        "    threading.Thread(target=threading.Event().wait, args=(30,), daemon=True).start()\n"
        "print('start', _start_for_here())\n"
        f"result = replay([{str(recordings[0])!r}], load(), io.StringIO(), decode_process=True)\n"
        "print('replayed', result.lines)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["starting", f"start {how}", "replayed 123"], done.stdout


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),
        ({}, None),
    ],
    ids=["v2-none", "v2-1.5", "v1-none", "v1-1", "no-cgroup"],
)
def test_a_containers_cpu_quota_is_read_so_one_cpu_gets_one_process(tmp_path, files, quota):
    from otel_dra.forked import cgroup_quota

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_quota(tmp_path) == quota


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads this process's children from /proc")
def test_a_judge_that_stops_early_leaves_no_decode_process_behind(recordings, start):
    def children() -> set[str]:
        return {pid for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()}

    before = children()
    steps = DecodeStage(recordings, Schema(), process=True, evaluate_every_ns=EVERY_NS).steps()
    assert next(steps).frames
    assert children() - before  # the decode process is running, a step or two ahead
    steps.close()
    assert children() == before


def test_tables_start_over_between_lines_even_when_a_line_holds_several_nodes(recordings, tmp_path, start):
    # A Collector batches many nodes into one line: each line here holds the three nodes of one tick, so the child's
    # table cap (2) is reached in the middle of a line; the line's frames keep the tables they were numbered with.
    lines = gzip.decompress(recordings[0].read_bytes()).decode().splitlines()
    batched = []
    for i in range(0, len(lines) - 2, 3):
        docs = [json.loads(line) for line in lines[i : i + 3]]
        batched.append(json.dumps({"resourceMetrics": [rm for d in docs for rm in d["resourceMetrics"]]}))
    path = tmp_path / "batched.jsonl"
    path.write_text("\n".join(batched) + "\n")
    here, _, schema = decoded([path], process=False)
    there, _, _ = decoded([path], process=True, max_tables=2)
    assert max(len(step.tables) / step.lines for step in here if step.lines) == 3
    same_steps(here, there, len(schema))


def test_a_bug_in_a_forked_child_reaches_the_judge_with_its_traceback(recordings, monkeypatch):
    # (a fork runs this process's code as it is at the fork: a decoder patched to fail fails there)
    def broken(self, raw, lineno):
        raise ZeroDivisionError("the decoder's bug")

    monkeypatch.setattr("otel_dra.decode.otlp_json.OtlpJsonDecoder.decode", broken)
    with pytest.raises(RuntimeError, match=r"(?s)decode process failed:.*ZeroDivisionError: the decoder's bug"):
        list(DecodeStage(recordings, Schema(), process=True, start="fork", evaluate_every_ns=EVERY_NS).steps())


def test_a_forked_child_that_dies_is_reported_with_its_exit_code(recordings, monkeypatch):
    import os

    monkeypatch.setattr("otel_dra.decode.stage._decode_in_child", lambda *args: os._exit(3))
    with pytest.raises(RuntimeError, match=r"decode process ended unexpectedly \(exit code 3\)"):
        list(DecodeStage(recordings, Schema(), process=True, start="fork", evaluate_every_ns=EVERY_NS).steps())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.floats(-2e6, 1e6))
def test_the_clock_reads_the_same_quantile_off_a_list_or_numpy(stamps, floor):
    """A small fleet's clock reads its quantile off a sorted list, a large one's off numpy's partition: the same
    order statistic (numpy's quantile, ``lower``), whatever the fleet's size."""
    from otel_dra.decode import clock as clock_mod

    floor = min(floor, max(stamps))  # (the newest stamp is always at or past the floor)
    expected = float(np.quantile([s for s in stamps if s >= floor], clock_mod.CLOCK_QUANTILE, method="lower"))
    for small in (0, 10_000):  # every fleet numpy's, then every fleet the list's
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(clock_mod, "SMALL_FLEET", small)
            assert clock_mod.recent_quantile(stamps, floor) == expected
