"""The CLI's words (issue #29): counted nouns in the singular for one, a bare ``otel-dra`` that shows
its help, ``--json`` answered with the flag that exists, and piped stderr lines never wrapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_dra.cli import main
from otel_dra.cli.common import plural
from otel_dra.faults import Fault
from tests.support.otlp_trace import write_trace


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [(0, "tick", "0 ticks"), (1, "tick", "1 tick"), (2, "bad input problem", "2 bad input problems")],
)
def test_plural(n: int, noun: str, said: str) -> None:
    assert plural(n, noun) == said


def test_plural_takes_an_irregular_plural() -> None:
    assert [plural(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``otel_dra.cli.main`` as the console script runs it: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    out, err = capsys.readouterr()
    return int(stopped.value.code or 0), out, err


def test_a_bare_otel_dra_prints_its_help_not_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """click's own convention for a group without a command (no_args_is_help): the help, exit 2."""
    code, out, err = run_main(capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: otel-dra [OPTIONS] COMMAND [ARGS]...\n"), err
    assert "error" not in err.lower()
    assert "Commands:" in err and "status" in err and "replay" in err


def test_a_bare_subgroup_prints_its_help_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "k8s")
    assert code == 2 and err.startswith("Usage: otel-dra k8s [OPTIONS] COMMAND") and "error" not in err.lower()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("status", "--json"), "otel-dra status: error: no such option: --json (did you mean -o json?)"),
        (("status", "--table"), "otel-dra status: error: no such option: --table (did you mean -o table?)"),
        (
            ("kubelet", "watch", "--json"),
            "otel-dra kubelet watch: error: no such option: --json (did you mean -o json?)",
        ),
    ],
)
def test_an_output_format_as_a_flag_names_the_right_flag(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], said: str
) -> None:
    code, out, err = run_main(capsys, *args)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith(said + " (see '"), line
    assert "--version" not in line


def test_another_unknown_flag_keeps_clicks_words(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "status", "--jsn")
    assert code == 2 and "No such option '--jsn'" in err and "-o json" not in err


def replay_piped(*args: str | Path, columns: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "otel_dra", "replay", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_piped_replay_lines_are_whole_however_narrow_columns_says(tmp_path: Path) -> None:
    """Piped stderr (a log, ``2>file``): every message one line, not wrapped at COLUMNS mid-sentence."""
    bad = '{"resourceMetrics": [' + "x" * 80  # a long decode error
    trace = write_trace(tmp_path / "t.jsonl", {"n": (2, [Fault("gpu-0", "memory_ecc", 60)])}, 120, extra_lines=[bad])
    out = tmp_path / "a-rather-long-folder-name-for-the-verdicts" / "verdicts.jsonl"
    out.parent.mkdir()
    result = replay_piped(trace, "-o", out, "--strict", columns=40)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    warnings = [line for line in lines if line.startswith("warning: line ")]
    assert len(warnings) == 1 and warnings[0].endswith("; line skipped"), result.stderr
    assert any(line.startswith("replayed ") and line.endswith(" evaluations") for line in lines), result.stderr
    assert any(line.startswith("skipped: ") and line.endswith(f"verdict lines to {out}") for line in lines)
    # One bad line: one problem, in the singular.
    assert lines[-1] == "otel-dra: error: --strict: 1 bad input problem (see the warnings above)"
    assert all(len(line) > 40 for line in (warnings[0], lines[-1]))  # longer than COLUMNS, yet whole
