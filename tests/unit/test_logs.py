"""Issue #14: no input floods the log. Repeated records are counted and summarised, long values are
shortened, every line is capped, and the summary is written even when the flood stops.

Issue #15: log tools parse every line: logfmt values quoted and escaped as the grammar requires
(checked by a strict parser of it below), or one JSON object per line; OTEL_LOG_LEVEL is honoured."""

import io
import json
import logging
import re
import subprocess
import sys
import threading
import time

import pytest

from otel_dra import logs
from otel_dra.logs import BURST, ERROR_BURST, MAX_LINE_CHARS, FloodLimiter, OneLineHandler, setup_logging
from tests.support.logfmt import logfmt

SUMMARY = re.compile(r"\.\.\. and ([\d,]+) more like it in the last ([\d.]+) s$")


def msg(line: str) -> str:
    return logfmt(line)["msg"]


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counted(lines: list[str]) -> int:
    """Records the summary lines say were not written."""
    return sum(int(m[1].replace(",", "")) for line in lines if (m := SUMMARY.search(msg(line))))


@pytest.fixture
def logger():
    """A logger of its own, written to one handler (returned beside it), closed at the end."""
    made: list[tuple[logging.Logger, OneLineHandler]] = []

    def make(
        limiter: FloodLimiter | None = None, log_format: str = "logfmt"
    ) -> tuple[logging.Logger, OneLineHandler, io.StringIO]:
        stream = io.StringIO()
        handler = OneLineHandler(stream, limiter, log_format)
        log = logging.getLogger(f"test.logs.{len(made)}.{id(handler)}")
        log.handlers[:] = [handler]
        log.propagate = False
        log.setLevel(logging.DEBUG)
        made.append((log, handler))
        return log, handler, stream

    yield make
    for log, handler in made:
        handler.close()
        log.handlers[:] = []


def test_a_flood_of_warnings_is_a_burst_and_one_summary(logger):
    log, handler, stream = logger(FloodLimiter(clock=Clock()))
    for _ in range(200_000):
        log.warning("disk %s is full", "sda")
    handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == BURST + 1
    assert all(msg(line) == "disk sda is full" for line in lines[:BURST])
    summary = logfmt(lines[-1])
    assert summary["level"] == "WARNING" and "disk %s is full" in summary["msg"]
    assert summary["msg"].endswith(f"... and {200_000 - BURST:,} more like it in the last 10 s")
    assert len(stream.getvalue()) < 2_000


def test_the_summary_comes_when_the_window_ends_without_another_record(logger):
    log, _, stream = logger(FloodLimiter(window_s=0.2))
    for _ in range(1_000):
        log.warning("link %s flapped", "eth0")
    assert counted(stream.getvalue().splitlines()) == 0  # the window is still open
    deadline = time.monotonic() + 5.0
    while counted(stream.getvalue().splitlines()) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = stream.getvalue().splitlines()
    assert len(lines) == BURST + 1
    assert counted(lines) == 1_000 - BURST
    # With nothing left to summarise the thread stops by itself.
    deadline = time.monotonic() + 5.0
    while any(t.name == "otel-dra-log-summaries" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "otel-dra-log-summaries" for t in threading.enumerate())


def test_a_new_window_writes_the_last_ones_summary_first(logger):
    clock = Clock()
    log, _, stream = logger(FloodLimiter(window_s=10, clock=clock))
    for _ in range(50):
        log.warning("fan %d stalled", 3)
    clock.now += 10.0
    log.warning("fan %d stalled", 3)
    lines = stream.getvalue().splitlines()
    assert len(lines) == BURST + 2
    assert msg(lines[-2]).endswith(f"and {50 - BURST:,} more like it in the last 10 s")
    assert msg(lines[-1]) == "fan 3 stalled"


def test_distinct_messages_are_not_merged(logger):
    log, handler, stream = logger(FloodLimiter(clock=Clock()))
    for i in range(60):
        log.warning("GPU %d is hot", i)
        log.warning("GPU %d lost its link", i)
        logging.getLogger(log.name + ".other").warning("GPU %d is hot", i)  # another logger: its own kind
    log.info("GPU %d is hot", 0)  # another level: its own kind
    handler.close()
    lines = stream.getvalue().splitlines()
    summaries = [line for line in lines if SUMMARY.search(msg(line))]
    assert len(summaries) == 3  # the child logger's records reach this handler: a kind of their own
    kinds = {(logfmt(s)["logger"], msg(s).split(" ...")[0]) for s in summaries}
    assert kinds == {
        (log.name, "GPU %d is hot"),
        (log.name, "GPU %d lost its link"),
        (log.name + ".other", "GPU %d is hot"),
    }
    assert all(counted([s]) == 60 - BURST for s in summaries)
    assert sum("level=INFO" in line for line in lines) == 1


def test_errors_have_their_own_burst_and_debug_is_not_limited(logger):
    log, handler, stream = logger(FloodLimiter(clock=Clock()))
    for _ in range(100):
        log.error("write failed")
        log.debug("tick")
    handler.close()
    lines = stream.getvalue().splitlines()
    assert sum("level=DEBUG" in line for line in lines) == 100
    errors = [line for line in lines if "level=ERROR" in line]
    assert len(errors) == ERROR_BURST + 1
    assert counted(errors) == 100 - ERROR_BURST


def test_the_limiter_tracks_a_bounded_number_of_kinds_and_loses_no_count(logger):
    limiter = FloodLimiter(max_keys=100, clock=Clock())
    log, handler, stream = logger(limiter)
    for i in range(1_000):
        template = f"event {i} happened"  # an f-string message: every one its own kind
        for _ in range(BURST + 2):
            log.warning(template)
        assert len(limiter) <= 100
    handler.close()
    lines = stream.getvalue().splitlines()
    assert counted(lines) == 1_000 * 2  # evicted kinds were summarised before they were forgotten
    assert len(lines) == 1_000 * (BURST + 1)


def test_a_megabyte_argument_gives_a_short_line(logger):
    log, handler, stream = logger(FloodLimiter(clock=Clock()))
    log.warning("device %s has model %s", "gpu-0", "x" * 1_000_000)
    log.warning("mapped %(model)s", {"model": "y" * 1_000_000})
    log.warning("whole message " + "z" * 1_000_000)  # not a template: the line cap holds it
    log.warning("many %s %s %s %s %s %s %s %s %s %s", *["w" * 1_000] * 10)
    log.warning("two\nlines %s", "a\nb")
    try:
        raise ValueError("v" * 1_000_000)
    except ValueError as err:
        log.error("failed", exc_info=err)
    handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6
    assert all(len(line) <= MAX_LINE_CHARS for line in lines)
    assert "gpu-0 has model " + "x" * 511 + "…" in msg(lines[0]) and len(lines[0]) < 700
    assert msg(lines[1]).endswith("y" * 511 + "…")
    # The cap shortens the message, not the line: it still parses, its quote closed.
    assert MAX_LINE_CHARS - 2 <= len(lines[2]) <= MAX_LINE_CHARS and msg(lines[2]).endswith("…")
    assert MAX_LINE_CHARS - 2 <= len(lines[3]) <= MAX_LINE_CHARS and msg(lines[3]).endswith("…")
    assert msg(lines[4]) == "two | lines a | b"
    assert logfmt(lines[5])["error"].startswith("ValueError: ") and len(lines[5]) < 700


def test_the_record_is_not_changed_for_other_handlers(logger):
    log, _, stream = logger()
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    log.addHandler(Keep())
    value = "m" * 2_000
    log.warning("model %s", value)
    assert seen[0].args == (value,)
    assert len(stream.getvalue()) < 700


def test_close_stops_the_summary_thread_and_writes_what_is_counted(logger):
    log, handler, stream = logger(FloodLimiter(window_s=3600))
    for _ in range(100):
        log.warning("still flooding")
    assert any(t.name == "otel-dra-log-summaries" for t in threading.enumerate())
    handler.close()
    assert not any(t.name == "otel-dra-log-summaries" for t in threading.enumerate())
    assert counted(stream.getvalue().splitlines()) == 100 - BURST


def test_setup_logging_installs_the_limited_handler(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        setup_logging("warning")
        first = root.handlers[0]
        for _ in range(10_000):
            logging.getLogger("otel_dra.test").warning("sample %d dropped", 7)
        setup_logging("warning")  # again (tests, the CLI): the old handler writes its counts and stops
        assert root.handlers != [first]
        assert isinstance(root.handlers[0], OneLineHandler)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
    lines = stream.getvalue().splitlines()
    assert len(lines) == BURST + 1
    assert counted(lines) == 10_000 - BURST


def test_a_flooding_process_writes_a_short_stderr_with_its_summary():
    code = (
        "import logging\n"
        "from otel_dra.logs import setup_logging\n"
        "setup_logging('info')\n"
        "log = logging.getLogger('otel_dra.flood')\n"
        "for i in range(200_000):\n"
        "    log.warning('device %s: attribute %s too long', 'gpu-0', 'x' * 100)\n"
        "log.warning('device %s: model %s', 'gpu-1', 'm' * 1_000_000)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(result.stderr) < 20_000
    assert all(len(line) <= MAX_LINE_CHARS for line in lines)
    written = [line for line in lines if not SUMMARY.search(msg(line)) and "too long" in line]
    # One window unless the loop outlasts it on a slow machine: every record is either written or counted.
    assert len(written) + counted(lines) == 200_000
    assert any(msg(line).endswith("m" * 511 + "…") for line in lines)
    assert len(lines) <= 4 * (BURST + 1)
    assert any("device %s: attribute %s too long ... and" in line for line in lines)


def test_constants_are_sane():
    assert logs.BURST < logs.ERROR_BURST
    assert logs.WINDOW_S == 10.0 and logs.MAX_KEYS == 1_000
    assert logs.MAX_ARG_CHARS < logs.MAX_LINE_CHARS


# Issue #15: lines log tools parse.

AWKWARD = [
    "plain",
    "two words",
    'a "quoted" word',
    "key=value inside",
    "back\\slash",
    "tab\there",
    "nul\x00bell\x07del\x7f",
    "carriage\rreturn",
    "unicode … é 漢字",
    "separators \u2028 \u2029 \x85 \x0b \x0c",
    "lone surrogate \udcff",
    "emoji 🛠 and a private-use \U000f0000",
    "",
    " leading and trailing ",
    '"',
    "=",
]


def _expected(text: str) -> str:
    """What a parser reads back: the text, with line breaks joined as the handler does."""
    return text.replace("\r\n", "\n").replace("\n", " | ")


@pytest.mark.parametrize("text", AWKWARD)
def test_every_logfmt_value_parses_back_to_itself(logger, text):
    """Spaces, quotes, "=", backslashes and non-printables in a value are quoted and escaped as logfmt
    requires, so a parser reads the same fields back (before #15 `msg=two words` split in two)."""
    log, handler, stream = logger()
    log.warning("device %s said %s", "gpu-0", text)
    named = logging.getLogger(f"{log.name}.{text.replace('.', '')}")  # a logger name is a value too
    named.warning("%s", text)
    try:
        raise RuntimeError(text)
    except RuntimeError as err:
        log.error("failed: %s", text, exc_info=err)
    handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    first, second, third = (logfmt(line) for line in lines)
    assert list(first) == ["time", "level", "logger", "msg"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert first["level"] == "WARNING" and first["logger"] == log.name
    assert first["msg"] == f"device gpu-0 said {_expected(text)}"
    assert second["msg"] == _expected(text) and second["logger"] == named.name
    assert third["error"] == f"RuntimeError: {_expected(text)}" and third["level"] == "ERROR"


def test_a_message_with_spaces_is_one_quoted_field(logger):
    log, handler, stream = logger()
    log.info("source %s: chosen with --source", "simulated")
    handler.close()
    line = stream.getvalue().strip()
    assert line.endswith(' msg="source simulated: chosen with --source"'), line
    assert line.startswith("time=") and " level=INFO " in line


@pytest.mark.parametrize("text", AWKWARD)
def test_json_lines_are_one_object_each(logger, text):
    log, handler, stream = logger(log_format="json")
    log.warning("device %s said %s", "gpu-0", text)
    try:
        raise ValueError(text)
    except ValueError as err:
        log.error("failed", exc_info=err)
    handler.close()
    lines = stream.getvalue().splitlines()  # splitlines: no U+2028 or NEL left raw to split on
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert list(first) == ["time", "level", "logger", "msg"]
    assert first["level"] == "WARNING" and first["logger"] == log.name
    assert first["msg"] == f"device gpu-0 said {_expected(text)}"
    assert second["error"] == f"ValueError: {_expected(text)}"
    assert all(line.encode("utf-8") for line in lines)  # a lone surrogate is escaped, not written raw


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_flood_summaries_and_the_cap_hold_in_both_formats(logger, log_format):
    log, handler, stream = logger(FloodLimiter(clock=Clock()), log_format)
    for _ in range(1_000):
        log.warning("disk %s is full", "sda")
    log.warning('whole "message" ' + "z\\" * 1_000_000)  # escapes make the encoded value twice as long
    log.warning("unicode " + "\x01" * 100_000)  # each escaped as six characters
    try:
        raise ValueError("v" * 1_000_000)
    except ValueError as err:
        log.error("x" * 1_000_000, exc_info=err)
    handler.close()
    lines = stream.getvalue().splitlines()
    parse = json.loads if log_format == "json" else logfmt
    records = [parse(line) for line in lines]
    assert len(lines) == BURST + 1 + 3
    assert all(len(line) <= MAX_LINE_CHARS for line in lines)
    summaries = [r for r in records if SUMMARY.search(r["msg"])]
    assert len(summaries) == 1 and summaries[0]["msg"].endswith(f"and {1_000 - BURST:,} more like it in the last 10 s")
    assert summaries[0]["level"] == "WARNING" and summaries[0]["logger"] == log.name
    long = records[BURST : BURST + 3]  # the summary comes last, at close
    assert all(r["msg"].endswith("…") for r in long)
    assert long[0]["msg"].startswith('whole "message" z\\z\\') and len(lines[BURST]) > MAX_LINE_CHARS - 8
    assert long[2]["error"].startswith("ValueError: vvv")


def test_setup_logging_writes_json_when_asked(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        setup_logging("info", "json")
        logging.getLogger("otel_dra.test").info("first sample: %d devices", 8)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
    record = json.loads(stream.getvalue())
    assert record["msg"] == "first sample: 8 devices" and record["logger"] == "otel_dra.test"
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", "xml")


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("debug", "debug"),
        ("DEBUG", "debug"),
        ("trace", "debug"),
        ("info", "info"),
        (" Info ", "info"),
        ("warn", "warning"),
        ("warning", "warning"),
        ("WARN", "warning"),
        ("error", "error"),
        ("fatal", "critical"),
        ("none", "critical"),
        ("5", "debug"),
        ("9", "info"),
        ("13", "warning"),
        ("17", "error"),
        ("21", "critical"),
        ("0", None),
        ("25", None),
        ("loud", None),
        ("", None),
    ],
)
def test_otel_log_level_values(value, level):
    assert logs.otel_log_level(value) == level


def test_no_url_userinfo_is_ever_written():
    """Issue #16: a credential in an endpoint (ours or the exporter's log line) is removed, in both formats."""
    from otel_dra.logs import OneLineFormatter, redact

    assert redact("to https://u:p%40ss@collector:4318/v1/metrics, then grpc://tok@h:1") == (
        "to https://collector:4318/v1/metrics, then grpc://h:1"
    )
    assert redact("mail ops@example.com") == "mail ops@example.com"  # not a URL: left alone
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "pushing to %s", ("http://a:secret@h:1",), None)
    for fmt in ("logfmt", "json"):
        assert "secret" not in OneLineFormatter(fmt).format(record)
