"""``otel-dra simulate`` and ``otel-dra score``: generate a labelled messy fleet, score verdicts on it.

Registered on the main group by :func:`register` (in ``otel_dra/cli/__init__.py``).
Imports nothing heavy until a command runs. Every user error is one line with exit code 2:
:class:`ScenarioError` for files that can't be read or written, ``click.UsageError`` for values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from otel_dra.cli.options import load_option, progress_bar

FORM_NAMES = ("short", "long")
SHAPE_NAMES = ("mixed", "tidy")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ScenarioError(click.ClickException):
    """A file problem: one line, exit code 2 (also under click's standalone mode)."""

    exit_code = 2


class Duration(click.ParamType):
    """A duration: ``50m``, ``2h``, ``3000s`` or plain seconds, as whole seconds."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        match = _DURATION.match(str(value))
        if match is None:
            self.fail(f"{value!r} is not a duration (e.g. 50m, 2h, 3000s or 3000)", param, ctx)
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if not seconds.is_integer():
            self.fail(f"{value!r} is not a whole number of seconds", param, ctx)
        return int(seconds)


def _size(n: int) -> str:
    """Bytes for people: 11.6 MB."""
    if n < 1000:
        return f"{n} B"
    value = n / 1000
    for unit in ("KB", "MB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


@click.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--labels",
    "labels_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the labels go (JSON: faults with onsets and deadlines, traps, the silent node, nodes' "
    "intervals and clock skews). Default: OUT with .labels.json for .jsonl.gz, e.g. fleet.labels.json.",
)
@click.option(
    "--form",
    type=click.Choice(FORM_NAMES),
    default="short",
    show_default=True,
    help="A named size: short (12 nodes x 4 GPUs x 50 min, every fault and trap at least once, seconds "
    "to write) or long (64 nodes x 8 GPUs x 2 h, the bench form, about a minute). The options below "
    "override it.",
)
@click.option("--nodes", type=int, default=None, help="Nodes in the fleet (6 or more). Default: the form's.")
@click.option("--devices-per-node", type=int, default=None, help="GPUs per node (1 to 16). Default: the form's.")
@click.option(
    "--duration",
    type=Duration(),
    default=None,
    help="Length of the recording: 50m, 2h, 3000s or seconds (at least 50m: a 15-minute healthy "
    "warm-up, then room for every deadline). Default: the form's.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Random seed: which devices fail, when, and everything else random. Same seed, same files.",
)
@click.option(
    "--shape",
    type=click.Choice(SHAPE_NAMES),
    default="mixed",
    show_default=True,
    help="mixed: four GPU models (one without limit series), sampling every 5-60 s with jitter, clocks "
    "skewed by up to 90 s. tidy: one model, every 10 s, no jitter or skew (the same faults and traps).",
)
@load_option("fleet's GPUs")
@click.option(
    "--faults/--no-faults",
    default=True,
    show_default=True,
    help="--no-faults places no fault: a healthy fleet with its traps, workload crashes, silent node and agent "
    "restart, for measuring false positives alone.",
)
def simulate(
    out: Path,
    labels_path: Path | None,
    form: str,
    nodes: int | None,
    devices_per_node: int | None,
    duration: int | None,
    seed: int,
    shape: str,
    load: str,
    faults: bool,
) -> None:
    """Write a messy GPU fleet as OTLP JSON lines (gzip when OUT ends in .gz) and its labels.

    The fleet mixes GPU models, sampling intervals and node clocks, and holds every fault kind
    of the telemetry contract (hard, soft, slow drifts, intermittent) on random devices at
    random times after a 15-minute healthy warm-up, traps that must not be flagged (spikes, a
    counter reset, a hot-plugged device, an agent restart, missed samples), a device shared by
    two nodes and a node that goes silent for ten minutes. Replay it with `otel-dra replay` and
    score the verdicts with `otel-dra score`. Label times are in each node's own clock.

    --load training, inference or mixed puts jobs on the GPUs (memory held full, power at its cap,
    checkpoint dips, crashes and crash loops labelled as workload traps) and adds the faults that
    show only under load (a hot GPU, a node's power brake, a hardware slowdown). Busy fleets need
    whole nodes for some of them: the short form fits; a smaller fleet is refused with what it needs.
    """
    from rich.console import Console

    from otel_dra.scenario.generate import form as make_form
    from otel_dra.scenario.generate import generate, labels_path_for

    changes: dict[str, Any] = {"seed": seed, "shape": shape, "load": load, "faults": faults}
    for key, value in (("nodes", nodes), ("devices_per_node", devices_per_node), ("duration_s", duration)):
        if value is not None:
            changes[key] = value
    try:
        config = make_form(form, **changes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    labels = labels_path if labels_path is not None else labels_path_for(out)
    if labels.resolve() == out.resolve():
        raise click.UsageError(f"--labels {labels} is the recording itself; pick another path")
    err = Console(stderr=True)
    progress = progress_bar(err)
    try:
        with progress:
            task = progress.add_task("simulating", total=config.duration_s)
            result = generate(config, out, labels, lambda done, total: progress.update(task, completed=done))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        where = exc.filename or out
        raise ScenarioError(f"cannot write {where}: {exc.strerror or exc}") from None
    click.echo(
        f"wrote {result.recording} ({result.lines:,} lines, {result.points:,} points, {_size(result.bytes)}) and "
        f"{result.labels} ({result.faults} faults, {result.traps} traps, {result.devices} devices on "
        f"{result.nodes} nodes) in {result.seconds:.1f} s"
    )


@click.command("score")
@click.argument("labels", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("verdicts", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: the figures and each target, met or missed, then what was missed. json: every figure "
    "as one JSON object (targets and passed included).",
)
def score_command(labels: Path, verdicts: Path, output: str) -> None:
    """Score VERDICTS (verdict JSON lines, as `otel-dra replay` writes them) against LABELS.

    Figures: hard faults failed/Unhealthy with a matching reason within their deadline (60 s,
    150 s for a lost device); soft faults flagged with a matching reason by theirs; false-positive
    episodes (non-ok outside any fault window, traps included) per 100 device-hours; extra
    episodes per intermittent fault (flapping); spurious Unknown (anywhere but the silent node
    during its silence and 5 minutes after, or a lost device); the silent node Unknown 150 s into
    its silence and never Unhealthy; median detection delay by severity. Targets: every hard fault,
    >= 95% of soft faults, <= 0.3 false positives per 100 device-hours, <= 0.1 extra episodes,
    no spurious Unknown, the silent node right. Exit code 0 whether targets are met or not; 2
    when a file can't be read.

    Labels of busy fleets (simulate --load) add one: the GPUs of a crashed job must not get a
    device-scoped non-ok verdict for it (target 0); a verdict of scope workload there is right,
    not a false positive. A fault labelled with a scope (a node's power brake) is caught only by
    verdicts of that scope and group. False positives are split by Unhealthy and by reason.
    """
    import json

    from otel_dra.scenario.figures import passes
    from otel_dra.scenario.score import score
    from otel_dra.scenario.score_labels import LabelsError, read_verdict_lines

    try:
        from otel_dra.scenario.score_labels import load_labels

        doc = load_labels(labels)
        result = score(doc, read_verdict_lines(verdicts))
    except LabelsError as exc:
        raise ScenarioError(str(exc)) from None
    except OSError as exc:
        raise ScenarioError(f"{verdicts}: cannot read: {exc.strerror or exc}") from None
    if result.verdict_lines == 0 and result.bad_lines > 0:
        raise ScenarioError(f"{verdicts}: none of its {result.bad_lines} lines is a verdict line")
    if output == "json":
        click.echo(json.dumps(result.to_json()))
        return
    _print_table(result, labels, verdicts)
    missed = passes(result)
    click.echo("all targets met" if not missed else f"{len(missed)} of {len(result.targets())} targets missed")


def _print_table(result: Any, labels: Path, verdicts: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a file or a pipe: no wrapping at 80 columns
        console = Console(width=160)
    table = Table(title=f"{verdicts} against {labels}")
    for col in ("target", "figure", "goal", "met"):
        table.add_column(col, overflow="fold")
    for t in result.targets():
        table.add_row(t.name, t.figure, t.goal, "[green]met[/]" if t.met else "[red]missed[/]")
    console.print(table)
    delays = ", ".join(f"{k} {v} s" for k, v in result.median_delay_s.items() if v is not None) or "-"
    console.print(
        f"median delay: {delays}; verdict lines: {result.verdict_lines} ({result.bad_lines} bad); devices with "
        f"verdicts: {result.devices_with_verdicts}/{result.devices_total} ({result.unlabelled_devices} unlabelled)",
        highlight=False,
    )
    if result.fp_episodes:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(result.fp_by_reason.items(), key=lambda kv: -kv[1])) or "-"
        console.print(
            f"false positives: {result.fp_unhealthy_episodes} Unhealthy, {result.fp_degraded_episodes} degraded; "
            f"by reason: {reasons}",
            highlight=False,
        )
    for title, rows in (("hard faults missed", result.hard_missed), ("soft faults missed", result.soft_missed)):
        if rows:
            console.print(f"{title}:", highlight=False)
            for m in rows:
                console.print(f"  {m['kind']} on {m['k8s.node.name']}/{m['hw.id']}: {m['why']}", highlight=False)
    if result.fp_examples:
        console.print("false positives (first few):", highlight=False)
        for e in result.fp_examples:
            traps = ", ".join(e["traps"])
            console.print(
                f"  {e['k8s.node.name']}/{e['hw.id']} at {e['from_s']} s: {', '.join(e['reasons']) or '-'} "
                f"({', '.join(e['states']) or '-'}); traps: {traps}",
                highlight=False,
            )
    if result.workload_examples:
        console.print("device-scoped verdicts on crashed jobs' GPUs (first few):", highlight=False)
        for e in result.workload_examples:
            console.print(
                f"  {e['k8s.node.name']}/{e['hw.id']} at {e['from_s']} s: {', '.join(e['reasons']) or '-'} "
                f"({', '.join(e['states']) or '-'})",
                highlight=False,
            )
    for e in result.spurious_unknown_examples:
        console.print(
            f"  spurious Unknown {e['k8s.node.name']}/{e['hw.id']} {e['from_s']} s to {e['to_s']}", highlight=False
        )


def register(group: click.Group) -> None:
    """Add ``simulate`` and ``score`` to the ``otel-dra`` group."""
    group.add_command(simulate)
    group.add_command(score_command)
