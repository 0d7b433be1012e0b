"""One log line per event: timestamp, level, component, message; an exception is
summarised on the same line (type and text), never as a traceback.

No input can flood the log (issue #14: 200,000 warnings once made 200,000 lines, 51 MB, and a 1 MB
attribute value a 2 MB line). Records of one kind (logger, level, message template) past a burst in
a window are counted, not written, and one summary line says how many there were; a string argument
is shortened before formatting and every line is capped.

Two formats (issue #15), both one line per record and both read by log tools as they are:
``logfmt`` (the default: ``time=... level=INFO logger=... msg="..."``, every value with a space,
quote, ``=`` or non-printable character quoted and escaped as logfmt requires) and ``json`` (one
JSON object per line, with the same fields). The flood limiter and the line cap hold in both.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TextIO

#: Records of one kind (same logger, level and unformatted message template) written per window;
#: the rest of the window's are counted and summarised in one line when it ends.
BURST: Final = 5
#: The burst for ERROR and above: errors are rarer and each says more, so more of them get through.
ERROR_BURST: Final = 20
#: How long a kind's window lasts, in seconds (its summary line says "in the last 10 s").
WINDOW_S: Final = 10.0
#: Most kinds tracked at once, so the limiter's state is bounded whatever is logged; past it the
#: least recently seen kind is forgotten (its summary written first, so no count is lost).
MAX_KEYS: Final = 1_000
#: A string argument (``record.args``) longer than this is shortened before formatting.
MAX_ARG_CHARS: Final = 512
#: No line is longer than this, its end marked with an ellipsis.
MAX_LINE_CHARS: Final = 4_096
#: What marks a cut.
ELLIPSIS: Final = "…"
#: How much of a message template is kept to key its kind: a bound on the state of each key.
_KEY_CHARS: Final = MAX_ARG_CHARS
#: Words of the template a summary line quotes, so a reader knows which message it counts.
_SUMMARY_WORDS: Final = 8


#: The record attribute that carries a line's own keys (``extra=keys(node=..., device=...)``).
FIELDS: Final = "otel_dra_fields"


def keys(**values: object) -> dict[str, dict[str, object]]:
    """``extra=`` for a log call whose line has keys of its own, beside ``msg``, so a log shipper's logfmt
    or JSON parser gets them as fields (``node=vm device=gpu-3 health=Unhealthy``), not inside the text."""
    return {FIELDS: values}


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + ELLIPSIS


def _short_args(args: Any) -> Any:
    """``record.args`` with each over-long string shortened: a 1 MB value is never formatted whole."""
    if isinstance(args, tuple):
        if any(isinstance(a, str) and len(a) > MAX_ARG_CHARS for a in args):
            return tuple(_cut(a, MAX_ARG_CHARS) if isinstance(a, str) else a for a in args)
        return args
    if isinstance(args, Mapping):  # log.info("%(key)s", {"key": ...})
        return {k: _cut(v, MAX_ARG_CHARS) if isinstance(v, str) else v for k, v in args.items()}
    return args


#: The formats :func:`setup_logging` takes (``--log-format``).
LOG_FORMATS: Final = ("logfmt", "json")

#: Characters that some readers take for a line break (``str.splitlines``, JavaScript, Unicode's
#: line and paragraph separators): never written raw, in either format.
_LINE_BREAKS: Final = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
_LOGFMT_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _u_escape(char: str) -> str:
    """``\\uXXXX`` (a UTF-16 surrogate pair past the BMP), as JSON and logfmt decoders read it."""
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _needs_quotes(value: str) -> bool:
    """Whether a logfmt value must be quoted: empty, or holding a space, ``=``, ``"`` or anything
    not printable (the go-logfmt rule, which Loki's and Grafana's parsers follow)."""
    return not value or any(c in ' ="\\' or not c.isprintable() for c in value)


def logfmt_value(value: str) -> str:
    """``value`` as a logfmt value: bare when it can be, else double-quoted with ``"`` and ``\\``
    backslash-escaped, control and other non-printable characters as ``\\n``, ``\\t`` or ``\\uXXXX``."""
    if not _needs_quotes(value):
        return value
    out = [_LOGFMT_ESCAPES.get(c) or (c if c.isprintable() or c == " " else _u_escape(c)) for c in value]
    return '"' + "".join(out) + '"'


def _json_line(fields: Mapping[str, str]) -> str:
    """One JSON object, non-ASCII kept readable but no character a reader could take for a line break."""
    text = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    if any(_json_escaped(c) for c in text):  # json.dumps escapes only those below U+0020
        text = "".join(_u_escape(c) if _json_escaped(c) else c for c in text)
    return text


def _json_escaped(char: str) -> bool:
    """A character :func:`_json_line` writes as ``\\uXXXX``: a line break, or a lone surrogate (a
    file name decoded with ``surrogateescape``), which no UTF-8 stream can carry raw."""
    return char in _LINE_BREAKS or "\ud800" <= char <= "\udfff"


#: The userinfo of a URL (``https://user:secret@host``): a credential, whoever logs the URL (we, the
#: OpenTelemetry exporter, urllib3), never written.
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


def redact(text: str) -> str:
    """``text`` with every URL's userinfo removed (``http://u:p@host`` → ``http://host``)."""
    return _USERINFO.sub(r"\1", text) if "@" in text else text


class OneLineFormatter(logging.Formatter):
    """ISO-8601 UTC timestamps, logfmt ``key=value`` framing (or, ``fmt="json"``, a JSON object),
    exceptions folded into the line as an ``error`` field; long arguments shortened and the line capped
    at :data:`MAX_LINE_CHARS` by shortening its values, so a capped line still parses."""

    converter = staticmethod(time.gmtime)

    def __init__(self, fmt: str = "logfmt") -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
        super().__init__("%(message)s")
        self.log_format = fmt

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """``2024-05-01T12:00:00.123Z``."""
        return time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created)) + f".{int(record.msecs):03d}Z"

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        """The line's fields, in order: time, level, logger, msg, the record's own (:func:`keys`) and, for
        an exception, error."""
        exc = record.exc_info
        # A copy: other handlers (a test's capture) see the record as it was logged.
        record = logging.makeLogRecord(record.__dict__)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.args = _short_args(record.args)
        message = _cut(record.getMessage(), MAX_LINE_CHARS)
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name, "msg": message}
        for key, value in (getattr(record, FIELDS, None) or {}).items():
            out.setdefault(str(key), _cut(str(value), MAX_ARG_CHARS))
        if exc and exc[1] is not None:
            out["error"] = f"{type(exc[1]).__name__}: {_cut(str(exc[1]), MAX_ARG_CHARS)}"
        # One line: a multi-line message reads as its lines joined by " | "; no URL's password or user.
        return {key: redact(value.replace("\r\n", "\n").replace("\n", " | ")) for key, value in out.items()}

    def encode(self, fields: Mapping[str, str]) -> str:
        if self.log_format == "json":
            return _json_line(fields)
        return " ".join(f"{key}={logfmt_value(value)}" for key, value in fields.items())

    def format(self, record: logging.LogRecord) -> str:
        fields = self.fields(record)
        line = self.encode(fields)
        # Too long: shorten the values (the message first) rather than cut the line, which would
        # leave an open quote or brace: the longest cut of each that fits (escapes make the encoded
        # length grow faster than the text's, so it is searched for).
        for key in ("msg", "error", "logger"):
            value = fields.get(key)
            if len(line) <= MAX_LINE_CHARS or not value:
                continue
            fits, low, high = "", 0, len(value) - 1
            while low <= high:
                mid = (low + high) // 2
                fields[key] = _cut(value, mid) if mid else ""
                if len(self.encode(fields)) <= MAX_LINE_CHARS:
                    fits, low = fields[key], mid + 1
                else:
                    high = mid - 1
            fields[key] = fits
            line = self.encode(fields)
        return line


Key = tuple[str, int, str]


@dataclass
class _Window:
    """One kind's current window: when it started, how many came in it, how many were not written."""

    start: float
    count: int = 0
    suppressed: int = 0
    head: str = ""


def _head(template: str) -> str:
    """The template's first words, for the summary line."""
    words = template.split()
    head = " ".join(words[:_SUMMARY_WORDS])
    return _cut(head, 120)


class FloodLimiter:
    """Which records to write: per kind (logger, level, template), the first ``burst`` of each
    ``window_s`` window; the rest are counted and come back as one summary record when the window
    ends. DEBUG is not limited (it is off unless asked for). Thread-safe; holds at most ``max_keys``
    kinds."""

    def __init__(
        self,
        burst: int = BURST,
        error_burst: int = ERROR_BURST,
        window_s: float = WINDOW_S,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or error_burst < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("FloodLimiter: burst, error_burst and max_keys must be at least 1, window_s positive")
        self.burst, self.error_burst, self.window_s, self.max_keys = burst, error_burst, window_s, max_keys
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: OrderedDict[Key, _Window] = OrderedDict()  # least recently seen first

    def __len__(self) -> int:
        return len(self._windows)

    @staticmethod
    def key(record: logging.LogRecord) -> Key:
        msg = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        return record.name, record.levelno, msg[:_KEY_CHARS]

    def admit(self, record: logging.LogRecord) -> tuple[bool, list[logging.LogRecord]]:
        """(write ``record``?, summaries to write before it: its kind's ended window, an evicted kind's)."""
        if record.levelno < logging.INFO:
            return True, []
        key = self.key(record)
        now = self.clock()
        summaries: list[logging.LogRecord] = []
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                while len(self._windows) >= self.max_keys:
                    old_key, old = self._windows.popitem(last=False)
                    if old.suppressed:
                        summaries.append(self._summary(old_key, old))
                window = self._windows[key] = _Window(now, head=_head(key[2]))
            else:
                self._windows.move_to_end(key)
                if now >= window.start + self.window_s:
                    if window.suppressed:
                        summaries.append(self._summary(key, window))
                    window.start, window.count, window.suppressed = now, 0, 0
            window.count += 1
            burst = self.error_burst if record.levelno >= logging.ERROR else self.burst
            if window.count <= burst:
                return True, summaries
            window.suppressed += 1
            return False, summaries

    def next_due(self) -> float | None:
        """When the earliest window with a count to summarise ends (None: nothing to summarise)."""
        with self._lock:
            due = [w.start + self.window_s for w in self._windows.values() if w.suppressed]
        return min(due, default=None)

    def expired(self, everything: bool = False) -> list[logging.LogRecord]:
        """Summaries of the windows that have ended (``everything``: of every window, at shutdown),
        in the order their windows started; their counts are reset."""
        now = self.clock()
        out: list[tuple[float, logging.LogRecord]] = []
        with self._lock:
            for key, window in self._windows.items():
                if window.suppressed and (everything or now >= window.start + self.window_s):
                    out.append((window.start, self._summary(key, window)))
                    window.suppressed = 0
        return [record for _, record in sorted(out, key=lambda pair: pair[0])]

    def _summary(self, key: Key, window: _Window) -> logging.LogRecord:
        name, level, _ = key
        text = f"{window.head} ... and {window.suppressed:,} more like it in the last {self.window_s:g} s"
        return logging.makeLogRecord(
            {"name": name, "levelno": level, "levelname": logging.getLevelName(level), "msg": text, "args": None}
        )


class OneLineHandler(logging.StreamHandler[TextIO]):
    """A stream handler with the one-line formatter and the :class:`FloodLimiter`.

    A window's summary is written when it ends, by a daemon thread that runs only while a count is
    waiting, even if no record follows; :meth:`close` (``logging.shutdown`` calls it at exit) writes
    whatever is still counted and stops that thread, so nothing is lost and no thread outlives it.
    """

    def __init__(
        self, stream: TextIO | None = None, limiter: FloodLimiter | None = None, log_format: str = "logfmt"
    ) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self.setFormatter(OneLineFormatter(log_format))
        self.limiter = limiter if limiter is not None else FloodLimiter()
        self._stop = threading.Event()
        self._thread_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        write, summaries = self.limiter.admit(record)
        if summaries or write:
            with self._locked():
                for summary in summaries:
                    self.emit(summary)
                if write:
                    self.emit(record)
        if not write:
            self._ensure_flusher()
        return write

    def _locked(self) -> _HandlerLock:
        return _HandlerLock(self)

    def _ensure_flusher(self) -> None:
        """Start the summary thread if none runs (it stops by itself once nothing is counted)."""
        if self._stop.is_set():
            return
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._flush_loop, name="otel-dra-log-summaries", daemon=True)
                self._thread.start()

    def _flush_loop(self) -> None:
        """Write each window's summary when it ends; exit when nothing is left to summarise."""
        while not self._stop.is_set():
            with self._thread_lock:
                due = self.limiter.next_due()
                if due is None:
                    self._thread = None
                    return
            if self._stop.wait(max(0.0, due - self.limiter.clock()) + 0.001):
                return
            # Take the lock before the summaries, and give up if closing: close() holds the lock
            # (logging.shutdown does) while it writes the rest and waits for this thread.
            while not self.acquire_timeout(0.05):
                if self._stop.is_set():
                    return
            try:
                if self._stop.is_set():
                    return
                for summary in self.limiter.expired():
                    self.emit(summary)
            finally:
                self.release()

    def acquire_timeout(self, timeout: float) -> bool:
        """The handler's I/O lock, waiting at most ``timeout`` seconds."""
        return self.lock.acquire(timeout=timeout) if self.lock is not None else True

    def close(self) -> None:
        """Write what is still counted, then stop the summary thread."""
        with self._locked():
            if not self._stop.is_set():
                self._stop.set()
                for summary in self.limiter.expired(everything=True):
                    self.emit(summary)
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        super().close()


class _HandlerLock:
    """``with``: the handler's I/O lock (``Handler.acquire``/``release``)."""

    def __init__(self, handler: logging.Handler) -> None:
        self.handler = handler

    def __enter__(self) -> None:
        self.handler.acquire()

    def __exit__(self, *exc: object) -> None:
        self.handler.release()


def setup_logging(level: str = "info", log_format: str = "logfmt") -> None:
    """Route every logger (ours, the SDK's, grpc's) through the one-line, flood-limited handler on
    stderr, writing ``log_format`` (:data:`LOG_FORMATS`)."""
    handler = OneLineHandler(sys.stderr, log_format=log_format)
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, OneLineHandler):
            old.close()  # its counts are written and its thread stopped
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


#: OTEL_LOG_LEVEL's names (the OpenTelemetry SDKs' own log level) as :mod:`logging` levels.
_OTEL_LEVEL_NAMES: Final = {
    "all": "debug",
    "verbose": "debug",
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "warning": "warning",
    "error": "error",
    "fatal": "critical",
    "critical": "critical",
    "none": "critical",
    "off": "critical",
}


def otel_log_level(value: str) -> str | None:
    """An ``OTEL_LOG_LEVEL`` value as a :mod:`logging` level name, None if it is not one.

    Names as the SDKs take them, any case (``debug``, ``info``, ``warn``/``warning``, ``error``, and
    ``trace``/``verbose``/``all`` as debug, ``fatal``, ``none``/``off`` as critical only), or an
    OpenTelemetry severity number: 1-8 debug (TRACE, DEBUG), 9-12 info, 13-16 warning, 17-20 error,
    21-24 critical (FATAL)."""
    text = value.strip().lower()
    if text in _OTEL_LEVEL_NAMES:
        return _OTEL_LEVEL_NAMES[text]
    if text.isdigit() and 1 <= int(text) <= 24:
        return ("debug", "debug", "info", "warning", "error", "critical")[(int(text) - 1) // 4]
    return None
