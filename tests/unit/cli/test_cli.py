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
        result = otel_dra(
            "run", "--source", "simulated", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port)
        )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "--prometheus-port" in result.stderr


@pytest.mark.parametrize("command", ["run", "fleet"])
def test_every_option_of_a_service_has_an_environment_variable(command):
    """Containers are configured through the environment: every flag of the long-running commands
    reads OTEL_DRA_<FLAG> (or the variable its help names), and --help says which."""
    import click

    from otel_dra.cli import cli

    options = [p for p in cli.commands[command].params if isinstance(p, click.Option) and p.name != "help"]
    assert options and all(p.envvar for p in options), [p.name for p in options if not p.envvar]
    assert "OTEL_DRA_INTERVAL" in " ".join(otel_dra("run", "--help").stdout.split())


def test_an_environment_variable_is_read_and_named_in_its_error():
    import os

    env = {**os.environ, "OTEL_DRA_DEVICES": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "run", "--source", "simulated"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2
    assert "env var: 'OTEL_DRA_DEVICES'" in result.stderr and "--devices" in result.stderr
