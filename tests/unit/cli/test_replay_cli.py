"""`otel-dra replay` on input that is not what it reads (issue #15, item 11): one line, exit code 2,
no warnings or empty summary table above it, and "see the warnings above" only when there are some."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otel_dra.faults import Fault
from tests.support.otlp_trace import write_trace


def replay(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_dra", "replay", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def otlp_line(metric: str) -> str:
    resource = {"attributes": [{"key": "k8s.node.name", "value": {"stringValue": "node-1"}}]}
    point = {"timeUnixNano": "1795000000000000000", "asDouble": 1.0}
    metrics = [{"name": metric, "gauge": {"dataPoints": [point]}}]
    return json.dumps({"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": metrics}]}]})


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("Dear operator,\nthis is a plain text file.\nIt is not telemetry.\n", "the 3 lines are not OTLP JSON metrics"),
        ("", "no lines to read"),
        ("\x00\x01\x02 binary junk \xff\n", "the one line is not OTLP JSON metrics"),
        ('{"resourceMetrics": []}\n', "1 line, 0 points, no device samples among them"),
        (otlp_line("app.requests") + "\n", "1 line, 1 point, no device samples among them"),
    ],
    ids=["plain-text", "empty", "binary", "no-metrics", "not-device-metrics"],
)
def test_unusable_input_is_one_line_and_exit_2(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "input.txt"
    path.write_text(content, errors="surrogateescape")
    result = replay(path, "-o", tmp_path / "v.jsonl")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no warnings, no empty table, no skip summary
    assert lines[0].startswith(f"otel-dra: error: nothing in {path} could be used: {why}"), lines[0]
    assert "warnings above" not in result.stderr


def test_plain_text_names_its_first_problem(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\nworld\n")
    result = replay(path)
    assert result.returncode == 2
    assert result.stderr == (
        f"otel-dra: error: nothing in {path} could be used: the 2 lines are not OTLP JSON metrics "
        "(first problem: line 1: is not JSON (Expecting value at column 1))\n"
    )


def test_strict_points_at_the_warnings_it_printed(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", {"n": (2, [Fault("gpu-0", "memory_ecc", 60)])}, 120, extra_lines=["x"])
    result = replay(trace, "-o", tmp_path / "v.jsonl", "--strict")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith("warning: line ") for line in lines)
    assert lines[-1] == "otel-dra: error: --strict: 1 bad input problem (see the warnings above)"


def test_clean_input_prints_no_warnings_and_its_table(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", {"n": (2, [])}, 120)
    result = replay(trace, "-o", tmp_path / "v.jsonl", "--strict")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr and "error" not in result.stderr
    assert "hw.state" in result.stderr and "Healthy" in result.stderr  # the summary table


def test_one_process_writes_what_the_default_two_process_replay_does(tmp_path: Path) -> None:
    from otel_dra.decode.stage import MIN_PROCESS_BYTES, _worth_a_process
    from otel_dra.forked import usable_cpus

    trace = write_trace(
        tmp_path / "t.jsonl", {"a": (4, [Fault("gpu-1", "memory_ecc", 60)]), "b": (4, [])}, 200, extra_lines=["x"]
    )
    assert trace.stat().st_size >= MIN_PROCESS_BYTES  # the default decodes it in a second process, given the core
    assert _worth_a_process([trace]) == (usable_cpus() >= 2)
    two, one = tmp_path / "two.jsonl", tmp_path / "one.jsonl"
    default = replay(trace, "-o", two)
    single = replay(trace, "-o", one, "--one-process")
    assert default.returncode == single.returncode == 0, default.stderr + single.stderr
    assert two.read_bytes() == one.read_bytes() and "memory_ecc" in two.read_text()
    assert default.stderr.replace(str(two), "OUT") == single.stderr.replace(str(one), "OUT")
    assert "warning: line " in default.stderr  # the bad line's warning crossed from the decode process


def test_the_replay_progress_bar_on_a_terminal_runs_no_thread_so_the_decode_process_can_fork() -> None:
    import io
    import threading

    from rich.console import Console

    from otel_dra.cli.options import advancer, progress_bar
    from otel_dra.decode.stage import _start_for_here

    threads = threading.active_count()
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with progress_bar(console, refresh_thread=False) as progress:
        task = progress.add_task("replaying", total=100)
        advance = advancer(progress, task, every_s=0.0)
        assert threading.active_count() == threads
        if threads == 1:
            assert _start_for_here() == "fork"
        advance(40)
        assert progress.tasks[0].completed == 40
        assert "40%" in console.file.getvalue()  # redrawn as it advanced, with no thread to do it
    with progress_bar(console) as progress:  # the other commands' bar keeps its thread
        assert threading.active_count() == threads + 1
