"""``otel-dra replay``: recorded telemetry through the classifier, as the fleet would judge it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from otel_dra.cli.common import load_policy, plural, stderr_console
from otel_dra.cli.options import Seconds, advancer, decode_limits, limit_options, progress_bar
from otel_dra.config import FleetConfig

if TYPE_CHECKING:
    from otel_dra.replay import ReplayResult


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", default="-", show_default=True, help="Verdict lines go here ('-': stdout).")
@click.option("--policy", "policy_file", default=None, help="Policy YAML merged over the default (see 'policy check').")
@click.option(
    "--strict", is_flag=True, help="Any bad input line is an error (exit code 2); by default bad lines are skipped."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw a state timeline to this PNG: a row per device, past 40 only those ever not ok and one counting "
    "the rest; episodes labelled with their reasons, UTC time (needs matplotlib: pip install 'otel-dra[plot]').",
)
@click.option(
    "--evaluate-every",
    type=Seconds(),
    default=FleetConfig.evaluate_every_s,
    show_default=True,
    help="Judge the fleet every this much of the recording's time (as 'otel-dra fleet' does live).",
)
@click.option(
    "--one-process",
    is_flag=True,
    help="Decode and judge in this one process (one core). By default, where a second core is there (affinity and "
    "a container's CPU quota allowing) and the input is 4 MB or more, decoding runs in a second process beside the "
    "judging: the same verdicts, sooner.",
)
@limit_options
def replay(
    files: tuple[Path, ...],
    output: str,
    policy_file: str | None,
    strict: bool,
    plot: Path | None,
    evaluate_every: float,
    one_process: bool,
    max_nodes: int,
    max_devices: int,
    max_devices_per_node: int,
    max_series: int,
    max_attribute_length: int,
) -> None:
    """Replay recorded telemetry (OTLP JSON lines, gzip too) through the classifier.

    Streams the files, judges the fleet every --evaluate-every of the recording's own time
    (the nodes' clocks with their offsets taken out, so a node whose clock is off neither
    looks silent nor makes others look so) and writes one verdict line per change (README, 'Replay recorded telemetry'),
    stamped with the device's node's time. Bad lines and points are skipped and counted; the
    first few are shown on stderr with their line numbers. Exit code 0 when valid data was
    replayed, 2 when nothing could be used (or, with --strict, when any line was bad).
    """
    from rich.table import Table

    from otel_dra.decode.files import InputFileError
    from otel_dra.replay import replay as run_replay
    from otel_dra.replay import skip_summary, summary_rows
    from otel_dra.replay_plot import plot_timeline

    policy = load_policy(policy_file)
    err = stderr_console()  # piped: every line whole, never wrapped mid-sentence
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install 'otel-dra[plot]'") from None
        folder = plot.parent if str(plot.parent) else Path(".")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.ClickException(f"cannot write --plot {plot}: {folder} is not a folder this user can write to")
    total = sum(map(_size_or_zero, files))
    progress = progress_bar(err, refresh_thread=False)  # (so the decode process can be forked)
    out = sys.stdout if output == "-" else None
    try:
        out = out or open(output, "w")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from exc
    try:
        with progress:
            reading = progress.add_task("replaying", total=total or None)
            limits = decode_limits(max_nodes, max_devices, max_devices_per_node, max_series, max_attribute_length)
            result = run_replay(
                list(files),
                policy,
                out,
                advancer(progress, reading),
                evaluate_every,
                limits,
                timeline=plot is not None,
                decode_process=False if one_process else None,
            )
    except InputFileError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if out is not sys.stdout:
            out.close()
    if not result.usable:  # one line, not warnings and an empty table above it
        raise click.ClickException(_nothing_usable(files, result))
    for error in result.errors:
        err.print(f"warning: {error}", highlight=False, markup=False)
    if result.error_count > len(result.errors):
        err.print(f"warning: ... and {result.error_count - len(result.errors)} more", highlight=False)
    rows = summary_rows(result)
    counts = (plural(result.lines, "line"), plural(result.points, "point"), plural(result.evaluations, "evaluation"))
    title = "replayed " + ", ".join(counts)
    err.print(title, highlight=False)  # its own line: a table's title wraps to the table's width
    if rows:
        table = Table()
        for col in ("health", "hw.state", "devices"):
            table.add_column(col)
        for health, state, n in rows:
            table.add_row(health, state, str(n))
        err.print(table)
    err.print(
        f"{skip_summary(result)}; wrote {plural(result.verdict_lines, 'verdict line')} to {output}",
        highlight=False,
    )
    if plot is not None:
        try:
            plot_timeline(result, plot)
        except OSError as exc:
            raise click.ClickException(f"cannot write --plot {plot}: {exc.strerror or exc}") from exc
        err.print(f"timeline: {plot}", highlight=False)
    if strict and result.error_count:
        above = " (see the warnings above)" if result.errors else ""
        raise click.ClickException(f"--strict: {plural(result.error_count, 'bad input problem')}{above}")


def _nothing_usable(files: tuple[Path, ...], result: ReplayResult) -> str:
    """Why nothing could be replayed, in one line: what was read, and the first problem in it."""
    names = ", ".join(map(str, files))
    first = f" (first problem: {str(result.errors[0]).removesuffix('; line skipped')})" if result.errors else ""
    if not result.lines:
        return f"nothing in {names} could be used: no lines to read"
    if result.lines_skipped == result.lines:
        lines = "the one line is" if result.lines == 1 else f"the {result.lines} lines are"
        return f"nothing in {names} could be used: {lines} not OTLP JSON metrics{first}"
    return (
        f"nothing in {names} could be used: {plural(result.lines, 'line')}, {plural(result.points, 'point')}, "
        f"no device samples among them{first}"
    )


def _size_or_zero(path: Path) -> int:
    """For the progress bar only: a file that can't be read is reported, with its reason, by the decoder."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
