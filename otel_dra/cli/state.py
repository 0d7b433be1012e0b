"""``otel-dra state show`` / ``otel-dra state forget``: the verdict engine's memory on disk, for the day
something goes wrong.

``show`` says what a restart would recall (per device: the faults held, their last evidence, what clears
them, the last verdict); ``forget`` drops one device's memory for an operator who knows better than the
evidence (a repair done by hand, a swap the serial number cannot show). It rewrites the file with the
agent's own writer (:meth:`~otel_dra.state.persist.StateFile.save`: atomic), never a second serializer.

The file is only read at start: a running ``otel-dra run`` or ``fleet`` holds the same memory in RAM and
writes it back every 30 s and at shutdown, so a forget takes effect only while no process writes the
file: stop it, forget, start it. A file written lately is taken as a process still running (or just
stopped), and ``forget`` asks for ``--yes`` before it rewrites it.

Nothing here moves a bad file aside (as the agent does at start): a person looking at it is told, in one
line, what is wrong with it.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from otel_dra.cli.common import load_policy, plural
from otel_dra.cli.options import output_option, policy_option

if TYPE_CHECKING:
    from otel_dra.classifier.memory import DeviceMemory, ReasonMemory
    from otel_dra.policy import Policy
    from otel_dra.state.persist import Saved, StateFile

#: A file written less than this long ago may have a running writer (one writes at least every 30 s, after an
#: evaluation: the agent's --interval, the fleet's tick, late by a loaded machine).
LIVE_S = 90.0  # (3 x otel_dra.state.persist.EVERY_S)
#: What a held failure waits for, by repair level (1 reset, 2 reboot, 3 replacement).
AWAITED = ("", "the device is reset", "its node is rebooted", "the device is replaced")
REPAIR_NAMES = ("", "reset", "reboot", "replace")

RUNNING_NOTE = (
    "A running otel-dra run/fleet keeps this memory in RAM too and writes the file again (every 30 s and at "
    "shutdown), which undoes a forget. Order: stop it, forget, start it. On Kubernetes a deleted pod is "
    "restarted at once and reads the file first: keep the agent's pod off the node (or scale the fleet to 0) "
    "while you forget."
)


# -- where ------------------------------------------------------------------------------------------
def _where(state_file: str | None, state_dir: str | None, node: str | None, fleet: bool) -> tuple[Path, str | None]:
    """The file to read, as ``otel-dra run`` (``agent-<node>.json``) or ``otel-dra fleet`` (``fleet.json``) name
    it, unless ``--state-file`` names it; and the agent's node when it chose the file (else None)."""
    from otel_dra.cli.state_dir import resolve_state_dir
    from otel_dra.config import resolve_node_name
    from otel_dra.state.persist import FLEET_FILE, agent_file

    if state_file:
        return Path(state_file), None
    folder = resolve_state_dir(state_dir or None, False)
    assert folder is not None  # (no --no-state here: no flag is the default folder)
    if fleet:
        return Path(folder) / FLEET_FILE, None
    node = resolve_node_name(node)
    return Path(folder) / agent_file(node), node


def _open(path: Path, agent_node: str | None, node: str | None, fleet: bool) -> tuple[StateFile, Saved, int | None]:
    """The file checked whole, as the agent checks it at start (but never moved aside): its
    :class:`StateFile`, what it holds, and when its writer last wrote it (unix ns; None: unknown). A file
    that is missing, unreadable or not ours (or not the process's asked for) is one line, exit 2."""
    from otel_dra.state.persist import MAX_FILE_BYTES, StateFile, StateFileError

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        mtime_ns: int | None = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        how = "" if agent_node is None else f" (node {agent_node}'s agent file"
        how += "" if agent_node is None else "; --node, --state-dir, --state-file or --fleet to look elsewhere)"
        raise click.ClickException(f"no state file at {path}{how}") from None
    except IsADirectoryError:
        raise click.ClickException(f"{path} is a directory, not a state file") from None
    except OSError as exc:
        raise click.ClickException(f"state file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    head = doc if isinstance(doc, dict) else {}
    if fleet:
        role, want = "fleet", None
    elif agent_node is not None:
        role, want = "agent", agent_node
    else:  # --state-file alone: whichever process's file it is; an agent's, the node it names
        role = "fleet" if head.get("role") == "fleet" else "agent"
        written_for = head.get("node")
        if role == "agent" and node and isinstance(written_for, str) and written_for != node:
            raise click.ClickException(f"{path} is node {written_for}'s agent file, not node {node}'s")
        want = written_for if role == "agent" and isinstance(written_for, str) else node
    file = StateFile(path, role, want if role == "agent" else None)
    try:
        saved = file.parse(raw)
    except StateFileError as exc:
        raise click.ClickException(f"state file {path} not read: {exc}") from None
    written = head.get("written_unix_nano")
    if isinstance(written, int) and not isinstance(written, bool) and written > 0:
        return file, saved, written
    return file, saved, mtime_ns


# -- words -------------------------------------------------------------------------------------------
def _utc(t: float) -> str | None:
    """UNIX seconds as an absolute UTC time (what a person compares with logs); None for never."""
    if not math.isfinite(t):
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def awaited_repair(policy: Policy, reason: str, m: ReasonMemory) -> int:
    """The repair a held reason waits for (1 reset, 2 reboot, 3 replacement; 0: it clears with its hold), as the
    verdict engine works it out (``VerdictEngine._codes``), from the policy's base rules (a model's overrides
    are not known from the file)."""
    from otel_dra.classifier.engine import REPAIR_LEVEL
    from otel_dra.classifier.features import STATE_OF_CODE
    from otel_dra.vocabulary import REMEDIATIONS, SCOPES

    if not m.on or reason == "stale" or policy.clears_by(reason) != "repair" or STATE_OF_CODE[m.state] != "failed":
        return 0
    scope = SCOPES[m.scope]
    if scope == "workload":
        code = REMEDIATIONS.index("check_workload")
    elif scope == "node":
        code = REMEDIATIONS.index(policy.node.remediation)
    else:
        rules = policy.rules.get(reason)
        ladder = list(rules["remediation"]) if rules is not None and "remediation" in rules else ["none"]
        per_step = max(1, policy.escalation.after - 1)
        step = min((max(m.episodes, 1) - 1) // per_step, len(ladder) - 1)
        code = max(REMEDIATIONS.index(ladder[step]), m.floor)
    return int(REPAIR_LEVEL[code])


def clearing(policy: Policy, reason: str, m: ReasonMemory, role: str) -> dict[str, Any]:
    """What clears a reason in the file: its time hold, or the repair it awaits and then a clean period."""
    from otel_dra.words import human_duration

    if not m.on:
        since = _utc(m.first_episode_at)
        text = f"not held; kept for its escalation count ({m.episodes} episode{'s' if m.episodes != 1 else ''}"
        return {"by": None, "text": text + (f" since {since})" if since else ")")}
    need = awaited_repair(policy, reason, m)
    if need:
        clean = human_duration(policy.clean_after_repair_s)
        text = f"held until {AWAITED[need]}, then {clean} clean"
        if need == 2 and role == "agent":
            text += " (the agent's own restart with the device present counts as the reboot)"
        return {"by": "repair", "awaits": REPAIR_NAMES[need], "clean_s": policy.clean_after_repair_s, "text": text}
    hold = policy.hold_s(reason)
    until = _utc(m.evidence_at + hold)
    text = f"time hold {human_duration(hold)}: clears at {until} without new evidence (silence stops the clock)"
    return {"by": "hold", "hold_s": hold, "until": until, "text": text}


def device_doc(policy: Policy, m: DeviceMemory, role: str) -> dict[str, Any]:
    """One device's memory in words: what ``-o json`` prints, and the table shows."""
    from otel_dra.classifier.features import STATE_OF_CODE
    from otel_dra.vocabulary import HEALTH, REASONS, REMEDIATIONS, SCOPES

    faults = []
    for r, held in sorted(m.reasons.items(), key=lambda kv: (not kv[1].on, kv[0])):
        reason = REASONS[r]
        faults.append(
            {
                "reason": reason,
                "held": held.on,
                "state": STATE_OF_CODE[held.state],
                "scope": SCOPES[held.scope],
                "last_evidence": _utc(held.evidence_at),
                "evidence": held.said or None,
                "episodes": held.episodes,
                "clears": clearing(policy, reason, held, role),
            }
        )
    v = m.verdict
    verdict = None
    if v is not None:
        verdict = {
            "health": HEALTH[v.health],
            "state": None if v.state < 0 else STATE_OF_CODE[v.state],
            "reasons": [REASONS[i] for i in range(len(REASONS)) if v.bits >> i & 1],
            "remediation": REMEDIATIONS[v.remediation],
            "since": _utc(v.since_ns / 1e9),
        }
    return {
        "k8s.node.name": m.node,
        "hw.id": m.hw_id,
        "hw.serial_number": m.serial or None,
        "last_heard": _utc(m.heard_s),
        "verdict": verdict,
        "faults": faults,
    }


def _ago(written_ns: int | None) -> float | None:
    return None if written_ns is None else max(0.0, time.time() - written_ns / 1e9)


# -- commands ----------------------------------------------------------------------------------------
def _file_options(f: Any) -> Any:
    """Which file: the agent's of this node by default, as ``otel-dra run`` names it."""
    for option in reversed(
        (
            click.option(
                "--state-file",
                metavar="PATH",
                default=None,
                help="The state file itself (agent-<node>.json or fleet.json); overrides --state-dir, --node, "
                "--fleet's choice of file.",
            ),
            click.option(
                "--state-dir",
                metavar="DIR",
                default=None,
                envvar="OTEL_DRA_STATE_DIR",
                show_envvar=True,
                help="Where otel-dra run/fleet keep it, as their --state-dir (the DaemonSet's: /var/lib/otel-dra). "
                "Default: $XDG_STATE_HOME/otel-dra (~/.local/state/otel-dra).",
            ),
            click.option(
                "--node",
                "node_name",
                metavar="NODE",
                default=None,
                envvar="OTEL_DRA_NODE_NAME",
                show_envvar=True,
                help="The node: picks the agent's file agent-NODE.json (default: as otel-dra run's --node-name: "
                "k8s.node.name in OTEL_RESOURCE_ATTRIBUTES, else NODE_NAME, else the host name); with --fleet "
                "or a fleet's --state-file, only that node's devices.",
            ),
            click.option("--fleet", is_flag=True, help="The fleet's file (fleet.json), not an agent's."),
        )
    ):
        f = option(f)
    return f


@click.group()
def state() -> None:
    """The verdict engine's memory kept across restarts: show it, forget a device.

    otel-dra run and otel-dra fleet keep held faults (an uncorrected ECC error awaiting a reset), their
    evidence and timers in a state file read back at start. `state show` lists it; `state forget DEVICE`
    drops one device's memory, for a repair or a swap the evidence cannot show (with the process stopped).
    """


@state.command()
@_file_options
@output_option("'table' for people; 'json' for scripts: one JSON document (jq).")
@policy_option("The policy the agent/fleet runs with (its hold times and which faults wait for a repair).")
def show(
    state_file: str | None,
    state_dir: str | None,
    node_name: str | None,
    fleet: bool,
    output: str,
    policy_file: str | None,
) -> None:
    """Show what a state file holds, per device: the faults held, their last evidence (UTC), what clears each
    (a time hold, or a reset / reboot / replacement then a clean period) and the last verdict.

    Reads the file as otel-dra run (agent-<node>.json) or otel-dra fleet (fleet.json) name it, and checks it
    as they do at start; a file they would refuse is one line here (exit 2), left in place.
    """
    path, agent_node = _where(state_file, state_dir, node_name, fleet)
    file, saved, written_ns = _open(path, agent_node, node_name, fleet)
    policy = load_policy(policy_file)
    devices = [m for m in saved.devices if not (file.role == "fleet" and node_name and m.node != node_name)]
    devices.sort(key=lambda m: (m.node, m.hw_id))
    doc = {
        "state_file": str(path),
        "role": file.role,
        "k8s.node.name": file.node,
        "written": _utc(written_ns / 1e9) if written_ns is not None else None,
        "devices": [device_doc(policy, m, file.role) for m in devices],
        "groups": groups_doc(saved),
    }
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    _print_table(doc, _ago(written_ns))


def groups_doc(saved: Saved) -> dict[str, Any]:
    """What the file holds of what devices share: per firmware version, its device-days and fatal events within
    the horizon kept; per link group on or still counting, its episodes."""
    groups = saved.groups
    if groups is None:
        return {"firmware": [], "links": []}
    return {
        "firmware": [
            {
                "hw.model": model,
                "hw.firmware_version": version,
                "device_days": round(sum(b[1] for b in buckets) / 86400.0, 3),
                "fatal_events": sum(b[2] for b in buckets),
            }
            for model, version, buckets in groups.firmware.versions
        ],
        "links": [
            {"group": link.group, "k8s.node.name": link.node or None, "on": link.on, "episodes": link.episodes}
            for link in groups.links
        ],
    }


def _print_table(doc: dict[str, Any], ago_s: float | None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from otel_dra.words import human_duration

    console = Console() if sys.stdout.isatty() else Console(width=100_000)  # piped: one line per row
    devices = doc["devices"]
    owner = f"node {doc['k8s.node.name']}'s agent" if doc["role"] == "agent" else "the fleet"
    ago = f" ({human_duration(ago_s)} ago)" if ago_s is not None else ""
    title = f"{doc['state_file']}: {owner}, written {doc['written']}{ago}; {plural(len(devices), 'device')} remembered"
    table = Table(title=Text(title), title_justify="left")
    for col in ("node", "device", "serial", "fault", "last evidence (UTC)", "clears", "last verdict"):
        table.add_column(col, overflow="fold")
    for d in devices:
        v = d["verdict"]
        verdict = (
            "-" if v is None else f"{v['health']} ({v['state'] or 'no state'}, {v['remediation']}) since {v['since']}"
        )
        faults = d["faults"] or [None]
        for i, fault in enumerate(faults):
            first = i == 0
            if fault is None:
                cells = ["-", "-", "-"]
            else:
                name = fault["reason"] + ("" if fault["held"] else " (not held)")
                seen = fault["last_evidence"] or "-"
                if fault["evidence"]:
                    seen += f" {fault['evidence']}"
                cells = [name, seen, fault["clears"]["text"]]
            row = (
                d["k8s.node.name"] if first else "",
                d["hw.id"] if first else "",
                (d["hw.serial_number"] or "-") if first else "",
                *cells,
                verdict if first else "",
            )
            table.add_row(*(Text(cell) for cell in row))  # as written: an evidence's "[...]" is no markup
    tables = [table]
    groups = doc["groups"]
    if groups["firmware"] or groups["links"]:
        shared = Table(title=Text("what devices share: firmware versions' history, link groups' escalation"))
        for col in ("group", "node", "held", "figures"):
            shared.add_column(col, overflow="fold")
        for f in groups["firmware"]:
            figures = f"{f['fatal_events']:g} fatal events in {f['device_days']:g} device-days"
            shared.add_row(Text(f"firmware/{f['hw.model']}/{f['hw.firmware_version']}"), "-", "-", Text(figures))
        for link in groups["links"]:
            node = Text(link["k8s.node.name"] or "-")
            shared.add_row(Text(link["group"]), node, "on" if link["on"] else "off", f"{link['episodes']} episodes")
        tables.append(shared)
    if console.is_terminal:
        for t in tables:
            console.print(t)
        return
    with console.capture() as captured:
        for t in tables:
            console.print(t)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


@state.command(epilog=RUNNING_NOTE)
@click.argument("device")
@_file_options
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help=f"Rewrite a file written in the last {LIVE_S:g} s (by a process that may still be running, or was just "
    "stopped) without refusing.",
)
def forget(
    device: str, state_file: str | None, state_dir: str | None, node_name: str | None, fleet: bool, yes: bool
) -> None:
    """Forget DEVICE's memory (its hw.id): its held faults, timers, escalation count, last verdict and counter
    baselines, so the next start meets it as a new device, healthy until new evidence.

    For when you know better than the evidence: a repair done by hand, a device swapped where the serial
    number cannot show it. The file is rewritten atomically by the agent's own writer; the other devices stay.
    """
    from otel_dra.state.persist import without

    path, agent_node = _where(state_file, state_dir, node_name, fleet)
    file, saved, written_ns = _open(path, agent_node, node_name, fleet)
    matches = [m for m in saved.devices if m.hw_id == device]
    if file.role == "fleet" and node_name:
        matches = [m for m in matches if m.node == node_name]
    if not matches:
        raise click.ClickException(_unknown(device, saved.devices, path))
    nodes = sorted({m.node for m in matches})
    if len(nodes) > 1:
        raise click.ClickException(
            f"{device} is on {len(nodes)} nodes in {path} ({', '.join(nodes)}): name one with --node"
        )
    ago = _ago(written_ns)
    if ago is not None and ago < LIVE_S and not yes:
        raise click.ClickException(
            f"{path} was written {ago:.0f} s ago: an otel-dra run/fleet still running rewrites it from its memory "
            "(every 30 s and at shutdown), undoing this; stop it first, then forget again (--yes if it is stopped)"
        )
    held = sorted({reason for m in matches for reason in _held(m)})
    # The writer's own time is kept: the file still says when its process last wrote it (a second forget
    # right after this one is not taken for a running process).
    kept = without(saved, [m.key for m in matches])
    try:
        file.save(kept.devices, written_ns, kept.counters, kept.groups)
    except OSError as exc:
        raise click.ClickException(f"state file {path} not rewritten: {exc.strerror or exc}; it is unchanged") from None
    what = f"held {', '.join(held)}" if held else "no fault held"
    left = plural(len(saved.devices) - len(matches), "device")
    click.echo(f"forgot {device} on node {nodes[0]} ({what}) in {path}; {left} left.")
    click.echo(f"It takes effect at the next start, if no process writes the file now. {RUNNING_NOTE}")


def _held(m: DeviceMemory) -> list[str]:
    from otel_dra.vocabulary import REASONS

    return [REASONS[r] for r, held in m.reasons.items() if held.on]


def _unknown(device: str, devices: list[DeviceMemory], path: Path) -> str:
    """One line: the device is not in the file, with the ids it holds that look like it."""
    ids = sorted({m.hw_id for m in devices})
    if not ids:
        return f"no device {device!r} in {path}: it remembers no device"
    close = difflib.get_close_matches(device, ids, n=5, cutoff=0.5)
    if close:
        return f"no device {device!r} in {path}; close matches: {', '.join(close)}"
    listed = ", ".join(ids[:10]) + (f" (and {len(ids) - 10} more)" if len(ids) > 10 else "")
    return f"no device {device!r} in {path}; it remembers: {listed}"
