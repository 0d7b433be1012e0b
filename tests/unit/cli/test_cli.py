"""The command line: help that explains, and user mistakes as one line with exit code 2."""

import socket
import subprocess
import sys

import pytest

from otel_dra.vocabulary import REASONS


def otel_dra(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_dra", *args], capture_output=True, text=True, timeout=timeout)


def test_help_explains_the_run_options():
    result = otel_dra("run", "--help")
    assert result.returncode == 0
    for option in (
        "--source",
        "--devices",
        "--fault",
        "--interval",
        "--prometheus-port",
        "--otlp-endpoint",
        "--node-name",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "NODE_NAME",
    ):
        assert option in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--fault", "gpu-3:ecc"),
        ("run", "--fault", "gpu-3"),
        ("run", "--fault", "gpu-42:thermal", "--devices", "4"),
        ("run", "--interval", "0"),
        ("run", "--devices", "zero"),
        ("run", "--otlp-protocol", "udp"),
        ("run", "--no-such-flag"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args):
    result = otel_dra(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("otel-dra")


def test_bad_fault_lists_every_valid_reason():
    result = otel_dra("run", "--fault", "gpu-3:melted@5")
    assert result.returncode == 2
    assert all(reason in result.stderr for reason in REASONS)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = otel_dra("run", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "--prometheus-port" in result.stderr
