"""Replay's decode stage: recorded lines into the judge's steps of frames, in this process or, with a second core,
in a child.

A replay is two stages in a row, each about half its time: decode (inflate, parse, frames) and judge
(ingest, evaluate). Where a second core is there, the decode stage runs in a child process a step or two
ahead of the judge, so a replay takes the longer stage's time rather than their sum (the
receivers → processors split of an OpenTelemetry Collector's pipeline, with a pipe between).

The stage also reads the recording's clock (:class:`~otel_dra.decode.clock.TraceClock`) line by line, beside the
decoding, and cuts the lines into the judge's steps (:class:`Step`): each ends at a line after which the judge
evaluates (:class:`Grid`, every few seconds of that clock) or after ``BATCH_LINES`` lines, and holds its frames as
a batch's parts, their values one matrix, and, where they are an evaluation's samples alone (the usual step), as the
batch the judge ingests (``Batch.of_parts``, with the rounds of a device sampled twice worked out on the stage's own
numbers for its node and ``hw.id``), made here beside the decoding: no object a line or a frame on the judge's side,
which in a small fleet's replay is the longer stage.

What crosses the pipe is a step: its frames' times, devices and tables (as numbers), its values as one float64
buffer, its batch's other arrays and rounds, its errors, refusals, size and clock. A device table crosses once, when
first used, so the judge's side holds one table object per table the decoder made, as it would in one process (the
classifier finds a node's rows by its table's identity); the schema's new columns cross before the first step that
uses them. The pipe and the judge's read buffer hold a few hundred kB of steps at most, so the child stays only that
far ahead: memory stays bounded whatever the recording's size.

The child is a fork of this process where that is safe (Linux, no other thread running: ~5 ms to its first line,
its modules imported already), else a new interpreter (~0.1 s of start and imports, the judge's side idle).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Literal, Protocol

import numpy as np
import numpy.ma  # (np.unique imports it at its first call, ~13 ms: here, so a forked decode process has it)

from otel_dra.classifier.batch import Batch
from otel_dra.decode.clock import TraceClock
from otel_dra.decode.files import InputFileError, read_lines
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.result import DecodeError
from otel_dra.forked import can_fork, in_child, usable_cpus
from otel_dra.frame import DeviceTable, Frame, Schema, stacked

#: Lines a step holds at most (a pipe write each: few enough to keep the judge's side busy, small enough to keep
#: the child near it). The first steps are shorter (1, 2, 4 ... lines): a recording's first lines are each node's
#: first, read the slow way (~2 ms each), and the judge's side starts on them sooner.
BATCH_LINES: Final = 32
#: Input below this many bytes (on disk) is decoded in-process: a child's start (up to ~0.3 s) would outweigh it
#: (``otel-dra replay --help`` says "4 MB").
MIN_PROCESS_BYTES: Final = 4 << 20
#: What the child process runs (its classes pickle under this module's name, not ``__main__``), on the
#: ``otel_dra`` package this process imported (its folder first on the path unless already on it: a source
#: checkout; an installed package's site-packages stays where it is, after the standard library).
_CHILD: Final = (
    "import sys; root = {root!r}; sys.path[:0] = [] if root in sys.path else [root]; "
    "from otel_dra.decode.stage import child_main; sys.exit(child_main())"
)
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])
#: The judge's side reads the pipe this much at a time, at most (a buffer, not a bound on a message): once the child
#: is ahead the pipe is full, and each read that frees room wakes the child, at the reader's cost; a read of all the
#: pipe holds takes every step waiting at once, one wake-up for several steps (the reads' CPU in a replay of 32
#: devices: 0.078 s with reads of 8 kB, 0.055 s).
READ_BUFFER: Final = 1 << 18
#: Device tables the child numbers at most (:attr:`DecodeStage.max_tables`): more than the decoder keeps.
MAX_TABLES: Final = 100_000
#: Devices the steps number (for their batches' rounds) before they start over: between steps, as a batch's
#: numbers are compared only with each other.
MAX_DEVICES: Final = 1_000_000

#: How the child starts (:attr:`DecodeStage.start`): "fork", a copy of this process (~5 ms: its modules are
#: imported already), or "exec", a new interpreter running ``_CHILD`` (~0.1 s of start and imports, before the
#: judge's side gets its first line).
Start = Literal["fork", "exec"]


@dataclass(frozen=True, slots=True)
class Step:
    """Lines decoded one after another, up to one the judge evaluates after (:class:`Grid`) or ``BATCH_LINES`` of
    them: their frames that hold samples as a batch's parts (each one's table, time, devices and when its line was
    heard; their values one matrix, a frame's rows after another's), what was wrong with the lines, their size for a
    progress bar, and where the recording's clock stands after them."""

    tables: list[DeviceTable]
    stamps: list[int]  # each frame's time (unix ns)
    sizes: list[int]  # each frame's devices: its rows of ``values``
    heard: list[int]  # the clock once each frame's line was heard (unix ns)
    values: np.ndarray  # (samples, columns): the schema's columns as of the step's last line
    #: The above as the judge ingests them, its rounds worked out, where they are an evaluation's batch whole (None:
    #: no frame with samples, or one of several steps with samples before an evaluation, whose batch the judge makes
    #: from their parts).
    batch: Batch | None
    frames: int  # frames decoded (those without samples too)
    lines: int
    errors: tuple[DecodeError, ...]
    limited: dict[str, int]
    size: int  # bytes, newlines included
    now_ns: int  # the clock once its last line with frames was heard (unix ns; 0: no line of it had frames)
    evaluate: bool  # the judge evaluates after it (at ``now_ns``)


class Grid:
    """When the judge evaluates: after a line that brings the recording's clock to the grid's next time (every
    ``every_ns`` from its first frame's), once however many of the grid's times the clock moved past."""

    def __init__(self, every_ns: int) -> None:
        self.every_ns = every_ns
        self.next_ns: int | None = None

    def due(self, now_ns: int) -> bool:
        """Whether a line with frames heard at ``now_ns`` is followed by an evaluation."""
        if self.next_ns is None:
            self.next_ns = now_ns
        if now_ns < self.next_ns:
            return False
        self.next_ns += self.every_ns * ((now_ns - self.next_ns) // self.every_ns + 1)
        return True


class _Steps:
    """Decoded lines gathered into :class:`Step`'s: the one place both modes (in this process, in a child) cut
    them, so the judge's side sees the same steps from either."""

    def __init__(self, schema: Schema, every_ns: int) -> None:
        self.schema = schema
        self.grid = Grid(every_ns)
        self.clock = TraceClock()
        self.lines = 0
        self._frames: list[Frame] = []  # those with samples
        self._heard: list[int] = []
        self._count = 0
        self._errors: list[DecodeError] = []
        self._limited: Counter[str] = Counter()
        self._size = 0
        self._now = 0
        self._most = 1  # lines the next step holds at most: 1, 2, 4 ... BATCH_LINES
        self._alone = True  # no step with samples taken since the last one the judge evaluates after
        # A number for each device (node, hw.id) seen, and each table's devices' numbers: the batch's rounds are
        # worked out on them as the judge's side would on its rows (one row a device).
        self._device_numbers: dict[tuple[str, str], int] = {}
        self._table_numbers: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}

    def add(self, frames: list[Frame], errors: tuple[DecodeError, ...], limited: dict[str, int], size: int) -> bool:
        """One decoded line; whether the judge evaluates after it."""
        self.lines += 1
        self._size += size
        if errors:
            self._errors.extend(errors)
        if limited:
            self._limited.update(limited)
        if not frames:
            return False
        now = self.clock.heard(frames)
        self._count += len(frames)
        self._now = now
        for frame in frames:
            if len(frame.values):
                self._frames.append(frame)
                self._heard.append(now)
        return self.grid.due(now)

    def _numbers_of(self, table: DeviceTable) -> np.ndarray:
        """The numbers of a table's devices (a loop over them only for a table not seen before)."""
        key = (table.node, table.ids)
        found = self._table_numbers.get(key)
        if found is None:
            numbers = self._device_numbers
            found = np.asarray([numbers.setdefault((table.node, d), len(numbers)) for d in table.ids], dtype=np.int64)
            self._table_numbers[key] = found
        return found

    def ended(self, due: bool) -> bool:
        """Whether the step ends with the line just added (``due``: the judge evaluates after it), or holds as many
        lines as it may."""
        if not (due or self.lines >= self._most):
            return False
        self._most = min(2 * self._most, BATCH_LINES)
        return True

    def take(self, evaluate: bool) -> Step:
        """The step of the lines added since the last one, with the batch the judge ingests them as (made here,
        beside the decoding, not on the judge's side: in a small fleet's replay that side is the longer)."""
        frames = self._frames
        matrices = [f.values for f in frames]
        tables = [f.devices for f in frames]
        stamps = [f.time_unix_nano for f in frames]
        sizes = [len(m) for m in matrices]
        width = len(self.schema)
        values = stacked(matrices, width)
        batch = None
        if evaluate and self._alone and tables:  # (the evaluation's samples are this step's alone: its batch whole)
            if len(self._device_numbers) >= MAX_DEVICES:  # (between steps: a batch's numbers are compared together)
                self._device_numbers.clear()
                self._table_numbers.clear()
            devices = np.concatenate([self._numbers_of(t) for t in tables])
            batch = Batch.of_parts(tables, stamps, sizes, self._heard, [values], width, devices)
        self._alone = evaluate or (self._alone and not tables)
        step = Step(
            tables,
            stamps,
            sizes,
            self._heard,
            values,
            batch,
            self._count,
            self.lines,
            tuple(self._errors),
            dict(self._limited),
            self._size,
            self._now,
            evaluate,
        )
        self._frames, self._heard, self._errors, self._limited = [], [], [], Counter()
        self.lines = self._count = self._size = self._now = 0
        return step


@dataclass
class DecodeTotals:
    """The decoder's counts over the whole input (set once every line was read)."""

    lines: int = 0
    lines_skipped: int = 0
    points: int = 0
    points_skipped: int = 0


@dataclass
class DecodeStage:
    """The lines of ``paths`` decoded into ``schema``'s columns under ``limits``: :meth:`steps` yields them in
    order, gathered into the judge's steps (an evaluation every ``evaluate_every_ns`` of the recording's clock),
    then :attr:`totals` holds the decoder's counts. ``process``: decode in a child process (None: when a second
    core is there and the input is ``MIN_PROCESS_BYTES`` or more). A file that can't be read raises
    :class:`~otel_dra.decode.files.InputFileError` after the lines before the damage, in either mode."""

    paths: Sequence[Path]
    schema: Schema
    limits: DecodeLimits = field(default_factory=DecodeLimits)
    process: bool | None = None
    #: The judge's evaluation grid (:class:`Grid`): the replay's ``evaluate_every_s``.
    evaluate_every_ns: int = field(kw_only=True)
    #: Device tables the child numbers before it starts over, between lines (both sides forget them; the next use
    #: re-sends one; a single line holding more nodes than this is numbered whole).
    max_tables: int = MAX_TABLES
    #: How a child starts (None: :func:`_start_for_here`).
    start: Start | None = None
    totals: DecodeTotals = field(default_factory=DecodeTotals)

    def steps(self) -> Generator[Step, None, None]:
        if self.process if self.process is not None else _worth_a_process(self.paths):
            yield from self._in_child()
        else:
            yield from self._here()

    def _here(self) -> Iterator[Step]:
        decoder = OtlpJsonDecoder(self.schema, limits=self.limits)
        steps = _Steps(self.schema, self.evaluate_every_ns)
        try:
            for _path, lineno, raw in read_lines(self.paths):
                decoded = decoder.decode(raw, lineno)
                due = steps.add(decoded.frames, decoded.errors, decoded.limited, len(raw) + 1)
                del raw, decoded  # nothing of this line held while the next is read (its frames wait for the step)
                if steps.ended(due):
                    yield steps.take(due)
        except InputFileError:
            if steps.lines:
                yield steps.take(False)
            raise
        finally:
            _count(decoder, self.totals)
        if steps.lines:
            yield steps.take(False)

    def _in_child(self) -> Iterator[Step]:
        if len(self.schema):
            raise ValueError("DecodeStage: a child process decodes into a new schema (this one has columns)")
        job = (list(map(Path, self.paths)), self.limits, self.max_tables, self.evaluate_every_ns)
        child, stream = _fork(*job) if (self.start or _start_for_here()) == "fork" else _exec(*job)
        tables: dict[int, DeviceTable] = {}
        try:
            while True:
                try:
                    message = pickle.load(stream)
                except EOFError:
                    code = child.wait(5.0)
                    raise RuntimeError(f"the replay's decode process ended unexpectedly (exit code {code})") from None
                kind = message[0]
                if kind == "step":
                    _, columns, new_tables, reset, numbers, parts, width, values, made = message
                    for column in columns:
                        self.schema.index(column)
                    if reset:
                        tables.clear()
                    tables.update(new_tables)
                    stamps, sizes, heard, *rest = parts
                    values = values.reshape(sum(sizes), width)
                    step_tables = [tables[n] for n in numbers]
                    batch = None if made is None else Batch(step_tables, sizes, made[0], made[1], values, *made[2:])
                    yield Step(step_tables, stamps, sizes, heard, values, batch, *rest)
                elif kind == "end":
                    self.totals = message[1]
                    return
                elif kind == "unreadable":
                    self.totals = message[2]
                    raise InputFileError(message[1])
                else:  # "failed": a bug, with the child's traceback
                    raise RuntimeError(f"the replay's decode process failed:\n{message[1]}")
        finally:
            stream.close()
            if child.poll() is None:  # the judge stopped early (an error, Ctrl-C): the child is not waited for
                child.terminate()
            child.wait()


class _Child(Protocol):
    """The decode process, as the judge's side handles it (a :class:`subprocess.Popen` has this)."""

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def _start_for_here() -> Start:
    """Fork where the platform has it and this process runs no other thread (a fork copies the calling thread
    alone: a lock another thread held would stay held in the copy), and not on macOS (its system libraries are
    not safe to use after a fork); otherwise a new interpreter."""
    return "fork" if can_fork() and threading.active_count() == 1 else "exec"


def _exec(paths: list[Path], limits: DecodeLimits, max_tables: int, every_ns: int) -> tuple[_Child, IO[bytes]]:
    """A new interpreter running this module's child_main (not multiprocessing's spawn, which imports the
    caller's __main__ again: a script without a __name__ guard would run twice)."""
    command = [sys.executable, "-c", _CHILD.format(root=_PACKAGE_ROOT)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=READ_BUFFER)
    assert child.stdin is not None and child.stdout is not None
    try:
        with child.stdin:
            pickle.dump((paths, limits, max_tables, every_ns), child.stdin)
    except BrokenPipeError:  # it is gone already: what it said, or its exit code, is read from its stdout
        pass
    return child, child.stdout


@dataclass
class _Forked:
    """A forked decode process, handled as a :class:`subprocess.Popen` is."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def terminate(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        """(``timeout`` is not used: the judge's side waits only once the child closed its end, or was told to go.)"""
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _fork(paths: list[Path], limits: DecodeLimits, max_tables: int, every_ns: int) -> tuple[_Child, IO[bytes]]:
    """A copy of this process that decodes and writes to a pipe, then leaves by ``os._exit``: nothing of this
    process's runs in it (no ``finally`` or ``atexit`` of the caller's, no flush of its inherited buffers, whose
    text would be written twice)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(reader)
            in_child()  # (Ctrl-C stops it, as terminate() does; what it was born with is never collected)
            sys.stdout = sys.stderr  # (the pipe is the messages' alone)
            with open(writer, "wb") as out:
                code = _serve(out, paths, limits, max_tables, every_ns)
        finally:
            os._exit(code)
    os.close(writer)
    return _Forked(pid), open(reader, "rb", buffering=READ_BUFFER)  # (closed by the caller)


def _worth_a_process(paths: Sequence[Path]) -> bool:
    if usable_cpus() < 2:
        return False
    size = 0
    for path in paths:
        try:
            size += Path(path).stat().st_size
        except OSError:  # read_lines says what is wrong with it, in either mode
            return False
    return size >= MIN_PROCESS_BYTES


def _count(decoder: OtlpJsonDecoder, totals: DecodeTotals) -> DecodeTotals:
    totals.lines, totals.lines_skipped = decoder.lines, decoder.lines_skipped
    totals.points, totals.points_skipped = decoder.points, decoder.points_skipped
    return totals


def _decode_in_child(
    send: Callable[[Any], None], paths: list[Path], limits: DecodeLimits, max_tables: int, every_ns: int
) -> None:
    """The child's side: decode every line, sending each step (see the module's doc)."""
    schema = Schema()
    decoder = OtlpJsonDecoder(schema, limits=limits)
    steps = _Steps(schema, every_ns)
    numbers: dict[int, tuple[int, DeviceTable]] = {}  # id(table) -> (its number, the table: kept, so ids stay)
    sent_columns = 0
    new_tables: dict[int, DeviceTable] = {}
    reset = False

    def flush(evaluate: bool) -> None:
        nonlocal sent_columns, reset
        columns = schema.columns[sent_columns:]
        sent_columns += len(columns)
        step = steps.take(evaluate)
        tables = [numbers[id(t)][0] for t in step.tables]
        # (Step's fields in its order, its tables as their numbers and its values as a buffer and a width)
        parts = (
            step.stamps,
            step.sizes,
            step.heard,
            step.frames,
            step.lines,
            step.errors,
            step.limited,
            step.size,
            step.now_ns,
            step.evaluate,
        )
        b = step.batch  # (its arrays beside the values; its tables are the step's, as numbers)
        made = None if b is None else (b.offsets, b.everyone, b.read, b.times, b.arrivals, b.rounds)
        values = step.values.reshape(-1)
        send(("step", columns, dict(new_tables), reset, tables, parts, step.values.shape[1], values, made))
        new_tables.clear()
        reset = False

    try:
        for _path, lineno, raw in read_lines(paths):
            decoded = decoder.decode(raw, lineno)
            unseen = {id(f.devices) for f in decoded.frames} - numbers.keys()
            if numbers and len(numbers) + len(unseen) > max_tables:
                # Start over before this line (a Collector's line holds many nodes: none of its frames may keep a
                # number the other side is about to forget), after sending what used the old numbers.
                if steps.lines:
                    flush(False)
                numbers.clear()
                reset = True
            for frame in decoded.frames:
                if id(frame.devices) not in numbers:
                    known = numbers[id(frame.devices)] = (len(numbers), frame.devices)
                    new_tables[known[0]] = frame.devices
            due = steps.add(decoded.frames, decoded.errors, decoded.limited, len(raw) + 1)
            del raw, decoded
            if steps.ended(due):
                flush(due)
    except InputFileError as exc:
        if steps.lines:
            flush(False)
        send(("unreadable", str(exc), _count(decoder, DecodeTotals())))
        return
    if steps.lines:
        flush(False)
    send(("end", _count(decoder, DecodeTotals())))


def child_main() -> int:
    """The child process (``_CHILD``): (paths, limits, max_tables) pickled on stdin; messages pickled to
    stdout, which nothing else writes to (anything printed goes to stderr)."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    try:
        paths, limits, max_tables, every_ns = pickle.load(sys.stdin.buffer)
    except KeyboardInterrupt:
        return 1
    return _serve(out, paths, limits, max_tables, every_ns)


def _serve(out: IO[bytes], paths: list[Path], limits: DecodeLimits, max_tables: int, every_ns: int) -> int:
    """The child's work, however it started: messages pickled to ``out``; its exit code."""

    def send(message: Any) -> None:
        pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    try:
        _decode_in_child(send, paths, limits, max_tables, every_ns)
    except (BrokenPipeError, KeyboardInterrupt):  # the judge's side is gone, or Ctrl-C reached both
        return 1
    except Exception:  # a bug: the judge's side raises it with this traceback
        with contextlib.suppress(OSError):
            send(("failed", traceback.format_exc()))
        return 1
    return 0
