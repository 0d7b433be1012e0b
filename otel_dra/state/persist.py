"""The verdict engine's memory on disk, so a restart (``kill -9`` included) forgets no held fault.

One small JSON file per process: ``agent-<node>.json`` for ``otel-dra run``, ``fleet.json`` for
``otel-dra fleet``, so both may share a directory. It holds, per device keyed by
``(k8s.node.name, hw.id)``, what :meth:`~otel_dra.classifier.Classifier.remember` gives: the last
verdict, the reasons held by hysteresis and their timers, the escalation episodes, the logged
events; and every device's counter baselines (``counters``: what
:meth:`~otel_dra.classifier.Classifier.baselines` gives), so an error counted while the process was down
is news after it restarts, not a first value. Times are wall-clock UNIX seconds, so a process
started after the hold has run out finds it expired.

Written atomically (a temporary file in the same directory, fsync, ``os.replace``, fsync of the
directory): a reader sees the old file or the new one, never half of one. The snapshot is taken
on the evaluating thread, right after an evaluation (so it is never torn by the next one): soon
after a verdict changes (at most one a ``min_gap_s``), every ``every_s`` otherwise, and once more at
shutdown; encoding and writing run on the store's own thread, so a slow disk never delays a sample.

Read back at start, before the first evaluation. A file that is not one of ours (not JSON,
truncated, another program's, another format version, another node's, or with any field out of
place) is one warning, renamed aside to ``<name>.corrupt-<UTC time>`` for a person to look at, and
a clean start: it is refused whole, never half-believed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import re
import shlex
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from otel_dra.classifier import Classifier, Verdict
from otel_dra.classifier.group_memory import GroupMemory
from otel_dra.classifier.memory import CounterBaselines, DeviceMemory

log = logging.getLogger(__name__)

FORMAT = "otel-dra-state"
VERSION = 1
FLEET_FILE = "fleet.json"
#: A state file larger than this is not one we wrote (a fleet of 100,000 devices writes about 15 MB).
MAX_FILE_BYTES = 512 * 1024 * 1024
#: How often the state is written while nothing changes, and the least time between two writes.
EVERY_S = 30.0
MIN_GAP_S = 1.0


class StateFileError(ValueError):
    """A state file that is not ours to believe: the message says why."""


class Saved(NamedTuple):
    """What a state file holds: the devices' memory, their counter baselines, and what they share (the firmware
    versions' history, the link groups' escalation; None in a file without)."""

    devices: list[DeviceMemory]
    counters: CounterBaselines | None = None
    groups: GroupMemory | None = None


def default_state_dir(env: Mapping[str, str] = os.environ) -> str:
    """``$XDG_STATE_HOME/otel-dra``, or ``~/.local/state/otel-dra`` when it is unset or not absolute
    (as the XDG Base Directory specification says)."""
    base = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "otel-dra")


def agent_file(node: str) -> str:
    """The agent's file name for ``node`` (characters outside ``[A-Za-z0-9._-]`` become ``_``)."""
    return f"agent-{re.sub(r'[^A-Za-z0-9._-]', '_', node)}.json"


def devices_memory(n: int) -> str:
    """``1 device's memory``, ``2 devices' memory``: the count as the log line says it."""
    return f"{n} device's memory" if n == 1 else f"{n} devices' memory"


def inspect_hint(path: Path) -> str:
    """How a person looks at and edits what was recalled: named where it is said, at start."""
    where = shlex.quote(str(path))
    return (
        f"`otel-dra state show --state-file {where}` lists them; "
        f"`otel-dra state forget DEVICE --state-file {where}`, with this process stopped, drops one"
    )


def without(saved: Saved, keys: Collection[tuple[str, str]]) -> Saved:
    """``saved`` less the devices ``keys`` (``(k8s.node.name, hw.id)``): their memory and their counter
    baselines, so the next process meets them as devices seen for the first time (``otel-dra state forget``;
    a baseline kept would measure a swapped device's counts against its predecessor's)."""
    drop = set(keys)
    counters = saved.counters
    if counters is not None:
        keep = np.asarray(
            [i for i, key in enumerate(zip(counters.nodes, counters.ids, strict=True)) if key not in drop],
            dtype=np.intp,
        )
        counters = dataclasses.replace(
            counters,
            nodes=tuple(counters.nodes[i] for i in keep),
            ids=tuple(counters.ids[i] for i in keep),
            serials=tuple(counters.serials[i] for i in keep),
            heard_s=counters.heard_s[keep],
            values=counters.values[keep],
        )
    return Saved([m for m in saved.devices if m.key not in drop], counters, saved.groups)


class StateFile:
    """One process's state file: ``role`` is ``agent`` or ``fleet``; an agent's names its node."""

    def __init__(self, path: Path, role: str, node: str | None = None) -> None:
        self.path = path
        self.role = role
        self.node = node

    # -- reading -------------------------------------------------------------------------------
    def load(self) -> list[DeviceMemory]:
        """The devices' memory in the file (see :meth:`read`)."""
        return self.read().devices

    def read(self) -> Saved:
        """What the file holds; nothing when there is no file. A file that is not ours is moved aside with
        one warning, and nothing is returned."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return Saved([])
        except OSError as exc:
            log.warning("state file %s cannot be read (%s); starting without it", self.path, exc)
            return Saved([])
        try:
            return self.parse(raw)
        except StateFileError as exc:
            aside = self.move_aside()
            where = f"moved to {aside}" if aside is not None else "left in place (it could not be moved)"
            log.warning("state file %s ignored: %s; %s; starting clean", self.path, exc, where)
            return Saved([])

    def parse(self, raw: bytes) -> Saved:
        """The file's content, checked whole; :class:`StateFileError` saying what is wrong."""
        if len(raw) > MAX_FILE_BYTES:
            raise StateFileError(f"larger than {MAX_FILE_BYTES} bytes")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise StateFileError(f"not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise StateFileError(f'not an otel-dra state file (no "format": "{FORMAT}")')
        version = doc.get("version")
        if version != VERSION or isinstance(version, bool):
            raise StateFileError(f"format version {version!r}, this otel-dra reads version {VERSION}")
        if doc.get("role") != self.role:
            raise StateFileError(f"written by the {doc.get('role')!r}, not the {self.role}")
        if doc.get("node") != self.node:
            raise StateFileError(f"written for node {doc.get('node')!r}, this is {self.node!r}")
        devices = doc.get("devices")
        if not isinstance(devices, list):
            raise StateFileError("no devices list")
        out = []
        for i, entry in enumerate(devices):
            try:
                memory = DeviceMemory.from_json(entry)
            except ValueError as exc:
                raise StateFileError(f"device {i}: {exc}") from None
            if self.node is not None and memory.node != self.node:
                raise StateFileError(f"device {i} is on node {memory.node!r}, not {self.node!r}")
            out.append(memory)
        counters = None
        if doc.get("counters") is not None:
            try:
                counters = CounterBaselines.from_json(doc["counters"])
            except ValueError as exc:
                raise StateFileError(f"counters: {exc}") from None
            if self.node is not None and any(node != self.node for node in counters.nodes):
                raise StateFileError(f"counters of a device not on node {self.node!r}")
        groups = None
        if doc.get("groups") is not None:
            try:
                groups = GroupMemory.from_json(doc["groups"])
            except ValueError as exc:
                raise StateFileError(f"groups: {exc}") from None
        return Saved(out, counters, groups)

    def move_aside(self) -> Path | None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside

    # -- writing -------------------------------------------------------------------------------
    def document(
        self,
        devices: list[DeviceMemory],
        now_ns: int,
        counters: CounterBaselines | None = None,
        groups: GroupMemory | None = None,
    ) -> dict[str, Any]:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "role": self.role,
            "node": self.node,
            "written_unix_nano": now_ns,
            "devices": [d.to_json() for d in devices],
        }
        if counters is not None:  # (version 1 readers before it ignore the key; a file without it is valid)
            doc["counters"] = counters.to_json()
        if groups is not None:  # (likewise: a file without it is valid, and older readers ignore it)
            doc["groups"] = groups.to_json()
        return doc

    def save(
        self,
        devices: list[DeviceMemory],
        now_ns: int | None = None,
        counters: CounterBaselines | None = None,
        groups: GroupMemory | None = None,
    ) -> None:
        """Write atomically: a temporary file beside it, fsync, rename over it, fsync the directory."""
        doc = self.document(devices, time.time_ns() if now_ns is None else now_ns, counters, groups)
        # orjson: a fleet's document (a million counter values at 100,000 devices) in a twentieth of json's time,
        # time this thread held the GIL the scrape and the receivers wait for (the same JSON, UTF-8 rather than
        # \u escapes; a non-finite float, which no field holds, would be null, refused when read back).
        data = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
        folder = self.path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        try:
            dir_fd = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)


class StateStore:
    """A component: recalls the file into ``classifier`` at :meth:`start` (before its first ingest),
    snapshots it after evaluations (soon after a change, else every ``every_s``), writes on its own
    thread, and writes once more at :meth:`shutdown`."""

    def __init__(
        self,
        classifier: Classifier,
        file: StateFile,
        every_s: float = EVERY_S,
        min_gap_s: float = MIN_GAP_S,
    ) -> None:
        self.classifier = classifier
        self.file = file
        self.every_s = every_s
        self.min_gap_s = min_gap_s
        self.recalled = 0  # devices whose memory was read at start
        self.writes = 0
        self._dirty = False
        self._last_snapshot = 0.0  # monotonic
        self._pending: Saved | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._failing = False  # a write failed: said once, until one succeeds
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        memories, counters, groups = self.file.read()
        self.recalled = self.classifier.recall(memories, time.time())
        self.classifier.recall_baselines(counters)
        self.classifier.recall_groups(groups, time.time())
        if memories:
            log.info(
                "state %s: %s recalled (%s)",
                self.file.path,
                devices_memory(self.recalled),
                inspect_hint(self.file.path),
            )
        self.classifier.evaluated.append(self._evaluated)
        self._last_snapshot = time.monotonic()
        self._thread = threading.Thread(target=self._writer, name="otel-dra-state", daemon=True)
        self._thread.start()

    def _evaluated(self, changed: list[Verdict]) -> None:
        """After each evaluation, on its thread: snapshot when due."""
        try:
            self._dirty = self._dirty or bool(changed)
            now = time.monotonic()
            since = now - self._last_snapshot
            if (self._dirty and since >= self.min_gap_s) or since >= self.every_s:
                self.snapshot(now)
        except Exception as exc:  # the memory must never take the evaluation down
            log.error("state snapshot failed", exc_info=exc)

    def snapshot(self, now: float | None = None) -> None:
        """Take the classifier's memory now, for the writer thread."""
        now_s = self.classifier.last_now_ns / 1e9 or time.time()
        c = self.classifier
        memories = Saved(c.remember(now_s), c.baselines(), c.group_memory(now_s))
        self._last_snapshot = time.monotonic() if now is None else now
        self._dirty = False
        with self._cond:
            self._pending = memories
            self._cond.notify_all()

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                memories, self._pending = self._pending, None
                closed = self._closed
            if memories is not None:
                self._write(memories)
            if closed:
                return

    def _write(self, memories: Saved) -> None:
        try:
            self.file.save(memories.devices, counters=memories.counters, groups=memories.groups)
        except (OSError, ValueError, TypeError) as exc:
            if not self._failing:
                log.warning("state file %s not written (%s); a restart would forget held faults", self.file.path, exc)
            self._failing = True
            return
        if self._failing:
            log.info("state file %s written again", self.file.path)
        self._failing = False
        self.writes += 1

    def shutdown(self, timeout_s: float) -> None:
        """The last snapshot, written before returning (within ``timeout_s``)."""
        if self._thread is None:
            return
        if self._evaluated in self.classifier.evaluated:
            self.classifier.evaluated.remove(self._evaluated)
        try:
            self.snapshot()
        except Exception as exc:
            log.error("state snapshot failed at shutdown", exc_info=exc)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
