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
        "--load",
        "OTEL_DRA_LOAD",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "NODE_NAME",
    ):
        assert option in result.stdout
    for profile in ("idle", "training", "inference", "mixed"):  # --load says what each profile does
        assert f"{profile}:" in " ".join(result.stdout.split())


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
        ("run", "--load", "busy"),
        ("run", "--load", "training"),  # not the simulated source: real GPUs run what they run
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
    assert result.stderr.splitlines()[-1] == (
        f"otel-dra: error: --prometheus-port {port} is in use by another process: stop it or pick another port "
        "(0 turns the endpoint off)"
    )


def busy_port() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1, as another process would hold it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    return held


@pytest.mark.parametrize("flag", ["--otlp-grpc-port", "--otlp-http-port", "--prometheus-port"])
def test_a_fleet_port_in_use_is_one_line_naming_the_flag_and_the_port(flag):
    """Issue #15: not "cannot serve on 127.0.0.1: cannot listen for HTTP endpoint on ...; pick other
    ports" (nor gRPC's own log line before it), but which flag, which port, what to do."""
    with busy_port() as held:
        port = held.getsockname()[1]
        ports = {"--otlp-grpc-port": "0", "--otlp-http-port": "0", "--prometheus-port": "0", flag: str(port)}
        result = otel_dra("fleet", "--host", "127.0.0.1", *(x for pair in ports.items() for x in pair))
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [
        f"otel-dra: error: {flag} {port} is in use by another process: stop it or pick another port "
        "(0 turns the endpoint off)"
    ], result.stderr


def test_the_agent_binds_with_host_like_the_fleet():
    """`otel-dra run --host` (OTEL_DRA_HOST) as `otel-dra fleet --host`; --prometheus-host and
    OTEL_EXPORTER_PROMETHEUS_HOST still work."""
    import click

    from otel_dra.cli import cli

    def host_option(command: str) -> click.Option:
        return next(p for p in cli.commands[command].params if isinstance(p, click.Option) and "--host" in p.opts)

    run_host, fleet_host = host_option("run"), host_option("fleet")
    assert "--prometheus-host" in run_host.opts
    assert run_host.envvar == ["OTEL_DRA_HOST", "OTEL_EXPORTER_PROMETHEUS_HOST"]
    assert fleet_host.envvar == "OTEL_DRA_HOST"
    help_text = " ".join(otel_dra("run", "--help").stdout.split())
    assert "--host, --prometheus-host" in help_text and "OTEL_DRA_HOST" in help_text
    assert "OTEL_EXPORTER_PROMETHEUS_HOST" in help_text
    with busy_port() as held:  # each spelling binds where it says: the held port is refused
        port = str(held.getsockname()[1])
        for args, env in (
            (["--host", "127.0.0.1"], {}),
            ([], {"OTEL_DRA_HOST": "127.0.0.1"}),
            ([], {"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"}),
        ):
            result = run_with_env(env, "run", "--source", "simulated", *args, "--prometheus-port", port)
            assert result.returncode == 2 and f"--prometheus-port {port} is in use" in result.stderr, result


def run_with_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_DRA_", "OTEL_LOG", "OTEL_EXPORTER"))}
    return subprocess.run(
        [sys.executable, "-m", "otel_dra", *args], capture_output=True, text=True, timeout=30, env={**clean, **env}
    )


def test_log_format_json_and_otel_log_level_in_a_running_agent():
    """--log-format json (OTEL_DRA_LOG_FORMAT): one JSON object per line. OTEL_LOG_LEVEL is read when
    --log-level and OTEL_DRA_LOG_LEVEL are not given; they win over it."""
    import json

    with busy_port() as held:
        port = str(held.getsockname()[1])
        agent = ("run", "--source", "simulated", "--prometheus-host", "127.0.0.1", "--prometheus-port", port)
        as_json = run_with_env({"OTEL_DRA_LOG_FORMAT": "json"}, *agent)
        quiet = run_with_env({"OTEL_LOG_LEVEL": "warn"}, *agent)
        numeric = run_with_env({"OTEL_LOG_LEVEL": "17"}, *agent)
        flag_wins = run_with_env({"OTEL_LOG_LEVEL": "error"}, *agent, "--log-level", "info", "--log-format", "json")
        env_wins = run_with_env({"OTEL_LOG_LEVEL": "error", "OTEL_DRA_LOG_LEVEL": "info"}, *agent)
        bad = run_with_env({"OTEL_LOG_LEVEL": "loud"}, *agent)
    logged = as_json.stderr.splitlines()[:-1]  # the last line is the port error
    records = [json.loads(line) for line in logged]
    assert records and all(set(r) >= {"time", "level", "logger", "msg"} for r in records)
    assert any(r["msg"] == "source simulated: chosen with --source" for r in records)
    for quieted in (quiet, numeric):
        assert quieted.returncode == 2 and len(quieted.stderr.splitlines()) == 1, quieted.stderr
    assert any(json.loads(line)["level"] == "INFO" for line in flag_wins.stderr.splitlines()[:-1])
    assert "level=INFO" in env_wins.stderr
    assert 'msg="OTEL_LOG_LEVEL=loud is not a log level: logging at info"' in bad.stderr
    assert "level=INFO" in bad.stderr


def test_every_command_with_log_level_has_log_format():
    import click

    from otel_dra.cli import cli

    for name, command in cli.commands.items():
        names = {p.name for p in command.params if isinstance(p, click.Option)}
        if "log_level" in names:
            assert "log_format" in names, name
    assert {"run", "fleet"} <= {n for n, c in cli.commands.items() if any(p.name == "log_format" for p in c.params)}


def all_commands():
    import click

    from otel_dra.cli import cli

    def walk(group, path):
        for name, command in group.commands.items():
            yield (*path, name), command
            if isinstance(command, click.Group):
                yield from walk(command, (*path, name))

    return list(walk(cli, ()))


def test_every_option_of_every_command_has_an_environment_variable_or_a_reason():
    """Issue #15: every flag of every command reads an environment variable (OTEL_DRA_<FLAG> for the
    services, OTEL_DRA_<COMMAND>_<FLAG> for the others) shown in --help, or is on a short list with why."""
    import click

    from otel_dra.cli import NO_ENVIRONMENT, NO_ENVIRONMENT_OPTIONS

    assert len(NO_ENVIRONMENT) + len(NO_ENVIRONMENT_OPTIONS) <= 5 and all(NO_ENVIRONMENT.values())
    paths = {path for path, _ in all_commands()}
    assert {("run",), ("fleet",), ("replay",), ("status",), ("policy", "check"), ("k8s", "render")} <= paths
    assert {("simulate",), ("score",)} <= paths
    missing, seen = [], {}
    for path, command in all_commands():
        for p in command.params:
            if not isinstance(p, click.Option) or p.name in NO_ENVIRONMENT_OPTIONS or path[0] in NO_ENVIRONMENT:
                continue
            if not p.envvar:
                missing.append((" ".join(path), p.opts[-1]))
            for var in [p.envvar] if isinstance(p.envvar, str) else p.envvar or []:
                seen.setdefault(var, set()).add(p.name)
    assert not missing, missing
    # One variable, one meaning: none is read by two options of different names (but the bind address,
    # which the agent and the fleet name alike on purpose).
    assert seen["OTEL_DRA_HOST"] == {"host", "prometheus_host"}
    assert all(len(names) == 1 for var, names in seen.items() if var != "OTEL_DRA_HOST"), seen
    assert "OTEL_DRA_K8S_RENDER_DRIVER" in seen and "OTEL_DRA_REPLAY_EVALUATE_EVERY" in seen
    assert "OTEL_DRA_POLICY" in seen


@pytest.mark.parametrize("command", [("k8s", "render"), ("status",), ("replay",), ("fleet",)])
def test_help_names_every_environment_variable(command):
    import click

    from otel_dra.cli import cli

    found = cli
    for name in command:
        found = found.commands[name]
    text = " ".join(otel_dra(*command, "--help").stdout.split())
    for p in found.params:
        if isinstance(p, click.Option) and p.envvar:
            for var in [p.envvar] if isinstance(p.envvar, str) else p.envvar:
                assert var in text, (command, p.name, var)
    if command == ("k8s", "render"):
        assert "OTEL_DRA_K8S_RENDER_OUTPUT" in text


def test_every_subcommand_prints_the_version():
    from click.testing import CliRunner

    from otel_dra.cli import cli

    expected = otel_dra("--version").stdout
    assert expected.startswith("otel-dra, version ")
    runner = CliRunner()
    for path, _ in all_commands():
        result = runner.invoke(cli, [*path, "--version"])
        assert result.exit_code == 0 and result.output == expected, (path, result.output)
    assert otel_dra("run", "--version").stdout == expected


@pytest.mark.parametrize("command", ["run", "fleet"])
def test_every_option_of_a_service_has_an_environment_variable(command):
    """Containers are configured through the environment: every flag of the long-running commands
    reads OTEL_DRA_<FLAG> (or the variable its help names), and --help says which."""
    import click

    from otel_dra.cli import cli

    params = cli.commands[command].params
    options = [p for p in params if isinstance(p, click.Option) and p.name not in ("help", "version")]
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
