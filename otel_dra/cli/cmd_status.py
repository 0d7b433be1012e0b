"""``otel-dra status``: every device's verdict from a running agent or fleet, as a table for people
or as the ``/v1/devices`` document for scripts, once or refreshed (``--watch``).

The table never splits a word: identifiers (device, health, state, reasons, remediation, ...) are
never wrapped, and on a terminal the evidence is one line, shortened with an ellipsis to what is
left of its width. The reasons column always stays whole (it is the failure mode); where the
terminal is too narrow for every column, the less needed ones go first (hw.state, scope, since,
the evidence, then the remediation). When stdout is not a terminal there is no wrapping or
shortening at all: one line per device, whatever ``COLUMNS`` says, for grep and friends.

Several nodes' devices come from a fleet (an agent serves its own node's only): the headline says
so, and so does a failed refresh. With one node or none, it may be either, and the words say
neither.

A verdict about more than its device (contract section 4: its ``scope`` is ``workload``, ``node``,
``link`` or ``firmware``) shows what it is about, its ``group`` (``node/train-007``; the scope's name
when it has none), in a ``scope`` column, which is there only when some verdict has one. A document
without ``scope`` (an older server's) is all device verdicts.

``--by group`` lists the findings by what they are about (:mod:`otel_dra.sinks.findings`): one row per
finding beyond a device (its scope, group, nodes, how many devices, their reasons, remediation and the
worst health and state among them), then the device findings (verdicts about the device alone that are not
Healthy and ok) as the device table shows them. Healthy devices with nothing to say are counted, not listed:
a link finding on 4 of a node's 8 GPUs reads as one row, not 4 among 8.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from otel_dra.cli.client import DEFAULT_PORT, URL_FORMS, base_url, read_devices
from otel_dra.cli.common import COLUMN_GAP as _GAP
from otel_dra.cli.common import listing, plural
from otel_dra.cli.options import Seconds, output_option

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from otel_dra.classifier.verdict import Verdict
    from otel_dra.sinks.findings import Summary


#: Narrower than this, the evidence column is not worth having beside the reasons column.
EVIDENCE_MIN_WIDTH = 24
#: Columns a narrow terminal drops, first to last, to keep the evidence at EVIDENCE_MIN_WIDTH and
#: then to fit at all. Never the device, its health or its reasons (nor a fleet's node column).
DROP_ORDER = ("hw.state", "scope", "would evict", "since", "evidence", "remediation")

#: Spaces between two columns of the table (a cell's right padding and the blank divider).

_COLORS = {"Unhealthy": "red", "Unknown": "yellow", "Healthy": "green"}

#: What ``--by`` lists rows by.
BY = ("device", "group")
#: A finding's nodes listed by name up to this many; more are counted.
NODES_SHOWN = 3


def _url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return base_url(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}; write {URL_FORMS}", ctx, param) from None


def _env(name: str) -> dict[str, Any]:
    return {"envvar": f"OTEL_DRA_STATUS_{name}", "show_envvar": True}  # OTEL_DRA_<COMMAND>_<FLAG>, as the CLI has it


@click.command()
@click.argument("url", default=f"localhost:{DEFAULT_PORT}", required=False, callback=_url, envvar="OTEL_DRA_STATUS_URL")
@output_option(
    "'table' for people; 'json' for scripts: the /v1/devices document as served, one JSON document "
    "(with --watch, one per line and refresh).",
    **_env("OUTPUT"),
)
@click.option(
    "--by",
    type=click.Choice(BY),
    default=BY[0],
    show_default=True,
    help="'device': one row per device; 'group': one row per finding beyond a device (a node, a link, a "
    "workload, a firmware version: its scope and group, nodes, devices, reasons, remediation), then the "
    "device findings. With -o json: the findings as {'groups': [...], 'devices': [...]}.",
    **_env("BY"),
)
@click.option(
    "--watch",
    "-w",
    is_flag=True,
    help="Refresh every --interval until Ctrl-C: in place on a terminal; piped, one table (or JSON "
    "line) per refresh. A failed refresh is shown and retried.",
    **_env("WATCH"),
)
@click.option(
    "--interval",
    type=Seconds(),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
    **_env("INTERVAL"),
)
@click.option(
    "--timeout",
    type=Seconds(),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the agent.",
    **_env("TIMEOUT"),
)
def status(url: str, output: str, by: str, watch: bool, interval: float, timeout: float) -> None:
    """Show every device's verdict from a running agent or fleet (URL/v1/devices).

    Unhealthy devices first, then Unknown, then the rest; with the reasons, the
    remediation and how long the verdict has stood, and, for a verdict about more
    than the device (its node, its workload, a link, a firmware version), what it
    is about in a scope column (node/train-007).

    URL is http://HOST:PORT, or HOST:PORT (http:// assumed), HOST (port 9464) or
    :PORT (this host); default localhost:9464, or OTEL_DRA_STATUS_URL.

    --by group lists what the findings are about: one row per node, link,
    workload or firmware finding (however many devices it touches), then the
    devices' own findings.
    """
    from rich.console import Console

    # Not a terminal: no wrapping at all (a width no table reaches), so each device is one line.
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
    _, doc = read_devices(url, timeout)
    if not watch:
        _emit(console, output, by, doc, url, None, once=True)
        return
    try:
        if output == "table" and console.is_terminal:
            _watch_in_place(console, by, doc, url, interval, timeout)
        else:
            _watch_lines(console, output, by, doc, url, interval, timeout)
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends: not an error
        return


def view(doc: dict[str, Any], url: str, by: str, width: int | None = None, when: str | None = None) -> RenderableType:
    """What a table shows of ``doc``: by device (:func:`device_table`) or by finding (:func:`finding_tables`)."""
    return finding_tables(doc, url, width, when) if by == "group" else device_table(doc, url, width, when)


def _emit(console: Console, output: str, by: str, doc: dict[str, Any], url: str, when: str | None, once: bool) -> None:
    if output == "json":
        text = json.dumps(findings_document(doc, url) if by == "group" else doc, indent=2 if once else None)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    elif console.is_terminal:
        console.print(view(doc, url, by, width=console.width, when=when))
    else:  # piped: the lines as they are, without the padding to the table's width
        with console.capture() as captured:
            console.print(view(doc, url, by, when=when))
        sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        sys.stdout.flush()


def _watch_lines(
    console: Console, output: str, by: str, doc: dict[str, Any], url: str, interval: float, timeout: float
) -> None:
    """Piped (or JSON): each refresh printed after the last, a blank line between tables."""
    while True:
        _emit(console, output, by, doc, url, _clock(interval), once=False)
        while True:
            time.sleep(interval)
            try:
                _, doc = read_devices(url, timeout)
                break
            except click.ClickException as exc:  # ``doc`` is still the last one read
                lost = f"lost the fleet at {url}: " if is_fleet(doc) else ""
                click.echo(f"otel-dra status: {lost}{exc.format_message()} (retrying every {interval:g}s)", err=True)
        if output == "table":
            console.print()


def _watch_in_place(console: Console, by: str, doc: dict[str, Any], url: str, interval: float, timeout: float) -> None:
    """On a terminal: one table redrawn in place (rich's Live), the last one left on screen."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    def table() -> RenderableType:
        return view(doc, url, by, width=console.width, when=_clock(interval))

    shown: RenderableType = table()
    with Live(shown, console=console, auto_refresh=False, transient=False) as live:
        while True:
            time.sleep(interval)
            try:
                _, doc = read_devices(url, timeout)
                shown = table()
            except click.ClickException as exc:
                lost = f"lost the fleet at {url}: " if is_fleet(doc) else ""
                error = Text(f"{time.strftime('%H:%M:%S')}: {lost}{exc.format_message()}; retrying", style="red")
                shown = Group(error, view(doc, url, by, width=console.width, when="last read"))
            live.update(shown, refresh=True)


def is_fleet(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` is a fleet's: devices of several nodes (an agent serves its own node's only).
    A fleet that has heard one node reads as either, and is not called a fleet."""
    from otel_dra.classifier.verdict import Verdict, VerdictInputError

    devices = doc.get("devices")
    nodes: set[str] = set()
    for d in devices if isinstance(devices, list) else []:
        try:
            nodes.add(Verdict.from_json(d, "").node)
        except VerdictInputError:
            continue  # (the table says what is wrong with it)
    return _several(nodes)


def _several(nodes: Iterable[str]) -> bool:
    """Devices of several named nodes: a fleet's answer (one that has heard one node is not called a fleet)."""
    return len(set(nodes) - {""}) > 1


def _clock(interval: float) -> str:
    return f"{time.strftime('%H:%M:%S')}, every {interval:g}s"


def _verdicts(doc: dict[str, Any], url: str) -> tuple[list[dict[str, Any]], list[Verdict]]:
    """(the device lines of a ``/v1/devices`` document, their verdicts); a one-line error for one that is not."""
    from otel_dra.classifier.verdict import Verdict, VerdictInputError

    raw = [d for d in doc.get("devices", []) if isinstance(d, dict)]
    try:
        return raw, [Verdict.from_json(d, f"{url}: devices[{i}]") for i, d in enumerate(raw)]
    except VerdictInputError as exc:
        raise click.ClickException(f"{exc}; is the server an otel-dra of this version?") from None


def device_table(
    doc: dict[str, Any], url: str, width: int | None = None, when: str | None = None, heading: str = ""
) -> Table:
    """The devices of a ``/v1/devices`` document as a table fitted to ``width`` columns without
    splitting a word (``None``: as wide as its rows, nothing wrapped); ``heading`` goes before its title."""
    from rich.text import Text

    from otel_dra.words import human_duration

    raw, devices = _verdicts(doc, url)
    now = time.time_ns()
    nodes = sorted({v.node for v in devices})
    one_node = len(nodes) == 1
    rows: list[dict[str, str]] = []
    for v, d in zip(devices, raw, strict=True):
        since = "".join(re.findall(r"\d+[dhms]", human_duration(max(0.0, (now - v.last_transition_time) / 1e9)))[:2])
        cluster = d.get("cluster")  # beside the verdict line: what the cluster said of its taint
        would = cluster.get("would_evict_pods") if isinstance(cluster, dict) else None
        rows.append(
            {
                "node": v.node or "-",
                "device": v.device or v.hw_id,
                "health": v.health,
                "hw.state": v.state or "-",
                # One a line on a terminal (a narrow column), else one line per device for grep.
                "reasons": ("\n" if width else ", ").join(v.reasons) or "-",
                "remediation": v.remediation,
                # What the remediation is for, when not the device: the shared thing's name, else its kind.
                "scope": "-" if v.scope == "device" else " ".join((v.group or v.scope).split()),
                "since": since,
                # What NoExecute would evict from it, as the cluster's device-taint controller says (1.35+).
                "would evict": f"{would} pods" if isinstance(would, int) else "-",
                "evidence": " ".join(v.message.split()),
            }
        )
    columns = ["node", "device", "health", "hw.state", "reasons", "remediation", "scope", "since", "would evict"]
    columns.append("evidence")
    if one_node:
        columns.remove("node")  # in the title instead
    if all(r["would evict"] == "-" for r in rows):
        columns.remove("would evict")  # no rule the cluster reported on
    if all(r["scope"] == "-" for r in rows):
        columns.remove("scope")  # every verdict is its device's own: nothing to say

    def natural(col: str) -> int:
        return max([len(col), *(len(line) for r in rows for line in r[col].splitlines())])

    hidden: list[str] = []
    evidence_width: int | None = None  # on a terminal: what is left for it; shorter evidence is cut
    if width is not None:
        evidence_min = min(EVIDENCE_MIN_WIDTH, natural("evidence"))

        def needed() -> int:
            fixed = sum(evidence_min if c == "evidence" else natural(c) for c in columns)
            return fixed + _GAP * (len(columns) - 1)

        # The reasons are the failure mode: the evidence is shortened, and other columns go, before them.
        for col in DROP_ORDER:
            if needed() <= width:
                break
            if col in columns:
                columns.remove(col)
                hidden.append(col)
        if "evidence" in columns:
            others = sum(natural(c) for c in columns if c != "evidence") + _GAP * (len(columns) - 1)
            evidence_width = max(evidence_min, width - others)

    cut = evidence_width is not None and natural("evidence") > evidence_width
    counts = Counter(r["health"] for r in rows)
    worst = ", ".join(f"{counts[h]} {h}" for h in ("Unhealthy", "Unknown") if counts[h])
    where = f" on node {nodes[0]}" if one_node and nodes[0] else f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    server = ", from the fleet" if _several(nodes) else ""
    title = f"{plural(len(rows), 'device')}{where}{server} at {url}" + (f" ({worst})" if worst else "")
    table = listing(heading + title + (f", {when}" if when else ""), width, _caption(rows, hidden, cut))
    for col in columns:
        # Whole, one line each; the evidence alone may be cut to what is left of the width (an ellipsis).
        limit = evidence_width if col == "evidence" else None
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=limit)
    for r in rows:
        table.add_row(*(Text(r[c], style=_COLORS.get(r[c], "") if c == "health" else "") for c in columns))
    return table


def _caption(rows: list[dict[str, str]], hidden: list[str], cut: bool) -> str | None:
    if not rows:
        return "no devices yet: a freshly started agent or fleet lists them once its first verdicts are in"
    if hidden or cut:
        what = ", ".join(hidden) + (" and " if hidden and cut else "") + ("the whole evidence" if cut else "")
        return f"too narrow for {what}: widen the terminal, pipe the output or use --output json"
    return None


def _is_finding(v: Verdict) -> bool:
    """A verdict with something to say: not Healthy, not ok, or with a reason (a degraded device is Healthy)."""
    return v.health != "Healthy" or v.state not in ("ok", None) or bool(v.reasons)


def _nodes(nodes: tuple[str, ...]) -> str:
    shown = ", ".join(nodes[:NODES_SHOWN])
    return shown + (f" and {len(nodes) - NODES_SHOWN} more" if len(nodes) > NODES_SHOWN else "")


def _split_findings(doc: dict[str, Any], url: str) -> tuple[list[Summary], list[dict[str, Any]], int]:
    """(the findings beyond a device, the device lines of the device findings, how many devices there are)."""
    from otel_dra.sinks.findings import summarize

    raw, verdicts = _verdicts(doc, url)
    own = [d for d, v in zip(raw, verdicts, strict=True) if v.scope == "device" and _is_finding(v)]
    return summarize(verdicts), own, len(raw)


def findings_document(doc: dict[str, Any], url: str) -> dict[str, Any]:
    """``--by group -o json``: ``groups``, one object per finding beyond a device, and ``devices``, the device
    findings' lines as served."""
    groups, own, _ = _split_findings(doc, url)
    return {
        "groups": [
            {
                "scope": s.finding.scope,
                "group": s.finding.group,
                "node": s.finding.node or None,  # a fleet-wide group's is none
                "nodes": list(s.nodes),
                "device_count": len(s.devices),
                "health": s.health,
                "hw.state": s.state,
                "reasons": list(s.reasons),
                "remediation": s.remediation,
                "devices": [{"k8s.node.name": n, "hw.id": h} for n, h in s.devices],
            }
            for s in groups
        ],
        "devices": own,
    }


def finding_tables(doc: dict[str, Any], url: str, width: int | None = None, when: str | None = None) -> RenderableType:
    """``--by group``: a table of the findings beyond a device, one row each, then the device findings'
    :func:`device_table` (when there are any). Every cell whole, on one line per item (``width`` only decides
    the box and whether reasons stack, as the device table does)."""
    from rich.console import Group
    from rich.text import Text

    groups, own, total = _split_findings(doc, url)
    sep = "\n" if width else ", "
    rows = [
        {
            "scope": s.finding.scope,
            "group": " ".join(s.finding.group.split()),
            "nodes": _nodes(s.nodes),
            "devices": str(len(s.devices)),
            "health": s.health,
            "hw.state": s.state or "-",
            "reasons": sep.join(s.reasons) or "-",
            "remediation": s.remediation,
        }
        for s in groups
    ]
    touched = sum(len(s.devices) for s in groups)
    title = (
        f"{plural(len(rows), 'finding')} beyond a device ({plural(touched, 'device')}), "
        f"{plural(len(own), 'device finding')}, of {plural(total, 'device')} at {url}"
    )
    table = listing(title + (f", {when}" if when else ""), width, None if rows else "no finding beyond a device")
    columns = ["scope", "group", "nodes", "devices", "health", "hw.state", "reasons", "remediation"]
    for col in columns:
        table.add_column(col, no_wrap=True, overflow="ellipsis", justify="right" if col == "devices" else "left")
    for r in rows:
        table.add_row(*(Text(r[c], style=_COLORS.get(r[c], "") if c == "health" else "") for c in columns))
    if not own:
        return table
    devices = device_table({"devices": own}, url, width, heading="device findings: ")
    return Group(table, Text(""), devices)
