"""``otel-dra kubelet watch`` against the project's real health server on a real unix socket: the
same ``KubeletHealthServer`` ``otel-dra run --kubelet-socket`` starts, fed real ``Verdict``s through a
real ``VerdictBoard``. Nothing is mocked: the command dials the socket as the kubelet does. One-shot
runs go through ``otel_dra.cli.main`` in this process; watches that must see a second update, Ctrl-C
or the stream ending run ``python -m otel_dra`` as a user would."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_dra.classifier import Verdict
from otel_dra.cli import cli, main
from otel_dra.cli.kubelet import DEFAULT_SOCKET
from otel_dra.sinks.kubelet import KubeletHealthServer, RegistrationServer
from otel_dra.state.board import VerdictBoard

REPO = Path(__file__).resolve().parents[3]
S = 10**9
ECC = "uncorrected ECC errors: 3 in the last 5m"


def verdict(dev: str, health: str = "Healthy", *, reported_s: int, message: str = "no evidence of a fault") -> Verdict:
    unhealthy = health == "Unhealthy"
    return Verdict(
        time_unix_nano=time.time_ns(),
        node="node-a",
        hw_id=dev,
        health=health,
        state="failed" if unhealthy else "ok",
        reasons=("memory_ecc",) if unhealthy else (),
        remediation="reset" if unhealthy else "none",
        message=message,
        pool="node-a",
        device=dev,
        last_transition_time=reported_s * S,
        last_reported_time=reported_s * S,
    )


def publish(board: VerdictBoard, *verdicts: Verdict) -> None:
    board.update(list(verdicts), lambda _n, _h: {})


@pytest.fixture
def reported_s() -> int:
    """When the devices' newest samples were taken: 90 s ago, so the age column has something to say."""
    return int(time.time()) - 90


@pytest.fixture
def board(reported_s: int) -> VerdictBoard:
    """gpu-0 healthy, gpu-1 unhealthy with evidence."""
    b = VerdictBoard()
    publish(
        b, verdict("gpu-0", reported_s=reported_s), verdict("gpu-1", "Unhealthy", reported_s=reported_s, message=ECC)
    )
    return b


@pytest.fixture
def serve(sock_dir: Path) -> Iterator[Callable[..., KubeletHealthServer]]:
    started: list[KubeletHealthServer] = []

    def start(board: VerdictBoard, **kwargs: object) -> KubeletHealthServer:
        server = KubeletHealthServer(str(sock_dir / "plugins" / "health.sock"), board, **kwargs)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown(0.2)


def watch(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``otel-dra kubelet watch ARGS`` through the CLI's own entry point: (exit code, stdout, stderr)."""
    try:
        main(["kubelet", "watch", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("otel-dra: error: ")
    return lines[0].removeprefix("otel-dra: error: ")


def rows(table: str) -> dict[str, dict[str, str]]:
    """A piped table's rows by device: columns split on the two-space gaps (no cell holds two spaces)."""
    lines = table.strip("\n").splitlines()
    header = re.split(r"\s{2,}", lines[1].strip())
    out = {}
    for line in lines[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), (header, line)
        out[cells[1]] = dict(zip(header, cells, strict=True))
    return out


def utc(unix_s: int) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- one update ------------------------------------------------------------------------------
def test_once_prints_every_device_as_the_kubelet_reads_it(serve, board, reported_s, capsys):
    server = serve(board)
    code, out, err = watch(capsys, server.socket_path, "--once")
    assert (code, err) == (0, ""), err
    title = out.splitlines()[0]
    assert title.startswith(f"2 devices from {server.socket_path} (v1alpha1.DRAResourceHealth), update 1 at ")
    assert title.endswith("(1 Unhealthy)")
    table = rows(out)
    assert list(table) == ["gpu-0", "gpu-1"], "in the order sent: by pool, then device"
    sick = table["gpu-1"]
    assert sick["pool"] == "node-a" and sick["health"] == "Unhealthy"
    assert sick["last updated (UTC)"] == utc(reported_s)
    assert sick["age"] in ("1m30s", "1m31s", "1m32s")
    assert sick["timeout"] == "30s"
    assert sick["message"].startswith("Unhealthy: state=failed reasons=memory_ecc remediation=reset;")
    assert sick["message"].endswith(ECC)
    assert table["gpu-0"]["health"] == "Healthy"


def test_once_as_json_is_one_line_with_the_protos_fields(serve, board, reported_s, capsys):
    server = serve(board, health_check_timeout_s=45)
    code, out, err = watch(capsys, server.socket_path, "--once", "-o", "json")
    assert (code, err) == (0, "")
    (line,) = out.splitlines()
    update = json.loads(line)
    assert update["socket"] == server.socket_path and update["update"] == 1
    assert update["service"] == "v1alpha1.DRAResourceHealth"
    assert abs(dt.datetime.fromisoformat(update["received"]).timestamp() - time.time()) < 5
    healthy, sick = update["devices"]
    assert sick["device"] == {"pool_name": "node-a", "device_name": "gpu-1"}
    assert sick["health"] == "UNHEALTHY" and healthy["health"] == "HEALTHY"
    assert sick["last_updated_time"] == reported_s, "int64 as a number, not proto JSON's string"
    assert sick["last_updated"] == utc(reported_s)
    assert 90 <= sick["age_seconds"] <= 92
    assert sick["health_check_timeout_seconds"] == 45
    assert sick["message"].endswith(ECC)


def test_the_v1_service_is_read_when_asked(serve, board, capsys):
    server = serve(board)
    code, out, err = watch(capsys, server.socket_path, "--once", "-o", "json", "--api-version", "v1")
    assert (code, err) == (0, "")
    assert json.loads(out)["service"] == "v1.DRAResourceHealth"


def test_an_unknown_device_and_an_empty_list_are_shown(serve, capsys):
    board = VerdictBoard()
    server = serve(board)
    code, out, _ = watch(capsys, server.socket_path, "--once")
    assert code == 0 and out.startswith("0 devices from ") and "no devices: the agent names none" in out
    publish(board, verdict("gpu-0", "Unknown", reported_s=int(time.time())))
    code, out, _ = watch(capsys, server.socket_path, "--once", "-o", "json")
    assert code == 0 and json.loads(out)["devices"][0]["health"] == "UNKNOWN", "the zero value is printed too"


def test_every_option_reads_its_environment_variable(serve, board, capsys, monkeypatch):
    """Issue #15: OTEL_DRA_KUBELET_WATCH_<FLAG>, and the SOCKET argument too, for containers and scripts."""
    server = serve(board)
    params = {p.name: p for p in cli.commands["kubelet"].commands["watch"].params}
    for name in ("output", "once", "timeout", "api_version", "socket_path"):
        var = "OTEL_DRA_KUBELET_WATCH_" + ("SOCKET" if name == "socket_path" else name.upper())
        assert params[name].envvar == var, name
    monkeypatch.setenv("OTEL_DRA_KUBELET_WATCH_SOCKET", server.socket_path)
    monkeypatch.setenv("OTEL_DRA_KUBELET_WATCH_OUTPUT", "json")
    monkeypatch.setenv("OTEL_DRA_KUBELET_WATCH_ONCE", "1")
    monkeypatch.setenv("OTEL_DRA_KUBELET_WATCH_API_VERSION", "v1")
    code, out, err = watch(capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["service"] == "v1.DRAResourceHealth"


def test_the_default_socket_is_where_the_daemonset_serves(capsys):
    manifests = " ".join(p.read_text() for p in sorted((REPO / "deploy" / "kubernetes").rglob("*.yaml")))
    (flag,) = set(re.findall(r"--kubelet-socket=(\S+)", manifests))
    assert flag == DEFAULT_SOCKET
    main(["kubelet", "watch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert flag in text
    for words in ("allocatedResourcesStatus", "Unknown", "OTEL_DRA_KUBELET_WATCH_TIMEOUT", "--once", "-o, --output"):
        assert words in text, words


# -- user errors: one line, exit 2 -----------------------------------------------------------
def test_a_missing_socket_says_what_to_start(sock_dir, capsys):
    path = str(sock_dir / "health.sock")
    line = one_error_line(*watch(capsys, path, "--once"))
    assert line == f"no socket at {path}: is `otel-dra run --kubelet-socket {path}` running on this node?"


def test_a_file_that_is_not_a_socket_is_named(sock_dir, capsys):
    (sock_dir / "health.sock").write_text("")
    line = one_error_line(*watch(capsys, str(sock_dir / "health.sock"), "--once"))
    assert "is a regular file, not a socket" in line


def test_a_socket_nobody_listens_on_is_a_stale_one(sock_dir, capsys):
    path = str(sock_dir / "health.sock")
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(path)  # bound, never listening: what a crashed agent leaves
        line = one_error_line(*watch(capsys, path, "--once"))
    assert line.startswith(f"nothing listens on {path}")


def test_a_socket_that_does_not_speak_grpc(sock_dir, capsys):
    path = str(sock_dir / "web.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()

        def answer_http() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):  # the command's own probe hangs up at once
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer_http, daemon=True).start()
        started = time.monotonic()
        line = one_error_line(*watch(capsys, path, "--timeout", "10"))
        assert time.monotonic() - started < 8, "told at once, not when --timeout runs out"
    assert line.startswith(f"no gRPC server answered on {path} (")
    assert line.endswith("is it the socket `otel-dra run --kubelet-socket` serves?")


def test_a_grpc_server_without_the_health_service(sock_dir, capsys):
    """The plugin registration socket: gRPC, but another service; both packages were tried."""
    registration = RegistrationServer(str(sock_dir / "registry"), "otel-dra.example.com", str(sock_dir / "x.sock"))
    registration.start()
    try:
        line = one_error_line(*watch(capsys, registration.socket_path, "--once"))
        assert line.startswith(
            f"{registration.socket_path} serves gRPC but not v1alpha1.DRAResourceHealth or v1.DRAResourceHealth "
            "(UNIMPLEMENTED)"
        )
        line = one_error_line(*watch(capsys, registration.socket_path, "--api-version", "v1"))
        assert "serves gRPC but not v1.DRAResourceHealth (UNIMPLEMENTED)" in line
    finally:
        registration.shutdown(0.2)


def test_a_socket_that_never_answers_times_out(sock_dir, capsys):
    path = str(sock_dir / "silent.sock")
    held: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
        started = time.monotonic()
        line = one_error_line(*watch(capsys, path, "--once", "--timeout", "0.5"))
        elapsed = time.monotonic() - started
    for conn in held:
        conn.close()
    assert line.startswith(f"nothing arrived from {path} within 0.5s")
    assert 0.5 <= elapsed < 5


def test_no_update_for_the_timeout_after_the_first_is_an_error(serve, board, capsys):
    """The agent stops resending while its verdicts are stale (liveness says no): the kubelet would
    time the devices out, and the watch says so after --timeout instead of waiting forever."""
    server = serve(board, health_check_timeout_s=0.3, liveness=lambda: False)
    code, out, err = watch(capsys, server.socket_path, "-o", "json", "--timeout", "1")
    assert len(out.splitlines()) == 1 and json.loads(out)["update"] == 1, "the first update came and was printed"
    line = one_error_line(code, "", err)
    assert line.startswith(f"no update from {server.socket_path} for 1s after 1 update: ")


def test_permission_denied_says_to_run_as_the_owner_or_root(serve, board, sock_dir):
    """A socket of another user (the agent's, 0600): dialed by a process that may not open it."""
    server = serve(board)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root may open anything: drop that power in the child, and give the socket away
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
        os.chown(server.socket_path, 65534, 65534)
    else:
        os.chmod(server.socket_path, 0)
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "otel_dra", "kubelet", "watch", server.socket_path, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=clean_env(),
    )
    if prefix and result.stderr.startswith("setpriv:"):
        pytest.skip(f"setpriv cannot drop the capability here: {result.stderr.strip()}")
    line = one_error_line(result.returncode, result.stdout, result.stderr)
    assert line.startswith(f"permission denied on {server.socket_path}: the socket is owner-only (0600, owner ")
    assert "or root" in line


# -- a running watch -------------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


class Process:
    """``python -m otel_dra kubelet watch ...`` with its stdout read line by line on a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_dra", "kubelet", "watch", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=clean_env(),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout: float = 20.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s") from None
        assert line is not None, f"the watch ended: {self.end()}"
        return line

    def table(self, timeout: float = 20.0) -> str:
        """The next table: its lines up to the blank line before the next one (or a second's silence)."""
        lines = [self.line(timeout)]
        while not lines[0]:  # the blank line between two tables
            lines = [self.line(timeout)]
        while True:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                break
            if not line:
                break
            lines.append(line)
        return "\n".join(lines)

    def end(self, timeout: float = 20.0) -> tuple[int, str]:
        """(exit code, stderr) once it has ended."""
        code = self.proc.wait(timeout)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes() -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(*args: str) -> Process:
        started.append(Process(*args))
        return started[-1]

    yield start
    for p in started:
        p.kill()


def test_a_health_change_is_the_next_update_and_ctrl_c_exits_130_quietly(serve, board, reported_s, processes):
    server = serve(board)  # resends every 10 s: the second line is the change, not a resend
    watching = processes(server.socket_path, "-o", "json")
    first = json.loads(watching.line())
    assert [d["health"] for d in first["devices"]] == ["HEALTHY", "UNHEALTHY"]
    publish(board, verdict("gpu-0", "Unhealthy", reported_s=reported_s + 60, message="device lost"))
    second = json.loads(watching.line(5.0))
    assert second["update"] == 2
    assert [d["health"] for d in second["devices"]] == ["UNHEALTHY", "UNHEALTHY"]
    assert second["devices"][0]["message"].endswith("device lost")
    assert second["devices"][0]["last_updated_time"] == reported_s + 60
    watching.proc.send_signal(signal.SIGINT)
    code, err = watching.end()
    assert code == 130 and err.strip() == "", err


def test_json_prints_every_resend_but_a_piped_table_only_what_changed(serve, board, reported_s, processes):
    """Resends every 0.1 s: each is a JSON line; the table is printed again only for the change."""
    server = serve(board, health_check_timeout_s=0.3)
    as_json = processes(server.socket_path, "-o", "json")
    as_table = processes(server.socket_path)
    assert [json.loads(as_json.line())["update"] for _ in range(4)] == [1, 2, 3, 4]
    first = as_table.table()
    assert " update 1 at " in first.splitlines()[0] and rows(first)["gpu-0"]["health"] == "Healthy"
    time.sleep(0.6)  # several resends, none printed
    assert as_table.lines.empty(), as_table.lines.get()
    publish(board, verdict("gpu-0", "Unhealthy", reported_s=reported_s + 1, message="device lost"))
    second = as_table.table()
    update = int(re.search(r" update (\d+) at ", second.splitlines()[0]).group(1))
    assert update > 3, "the resends in between were read, not printed"
    assert second.splitlines()[0].endswith("(2 Unhealthy)")
    assert rows(second)["gpu-0"]["health"] == "Unhealthy"


def test_the_stream_ending_is_one_line_and_exit_2(serve, board, processes):
    server = serve(board)
    watching = processes(server.socket_path, "-o", "json")
    assert json.loads(watching.line())["update"] == 1
    server.shutdown(0.2)
    code, err = watching.end()
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"otel-dra: error: the stream from {server.socket_path} ended after 1 update (")
    assert line.endswith("the kubelet turns every device Unknown when its stream ends")


def test_a_reader_that_stops_reading_ends_the_watch_quietly(serve, board):
    """``... -o json | head -1``: the broken pipe ends the watch, without a traceback."""
    server = serve(board, health_check_timeout_s=0.3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_dra", "kubelet", "watch", server.socket_path, "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=clean_env(),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["update"] == 1
        proc.stdout.close()  # as head does once it has its line; the next resend meets a broken pipe
        assert proc.wait(20) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
