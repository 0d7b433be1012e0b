"""Hypothesis writes command lines for every ``otel-dra`` command, from each command's own flags
with good, bad and strange values, and runs them through ``otel_dra.cli.main`` in this process:
each ends in exit code 0, or 2 with its last line an ``otel-dra...: error:`` line, and never
in an exception or a traceback (issue #7: bad input on the command line).

The agent's and the fleet's run loops are the one thing replaced, since a command line that is
good would otherwise run until stopped. Everything a command does before its loop still runs:
parsing, validation, the policy, the source, the classifier, the TLS files.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import click
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_dra.agent import Agent
from otel_dra.cli import common as cli_common
from otel_dra.cli import main as cli_main
from otel_dra.fleet import Fleet

JUNK = ["", "-1", "0", "nan", "inf", "-inf", "1e309", "abc", "☃", "x" * 300, "--", "-h"]


def flag_values(files: dict[str, str]) -> dict[str, dict[str, list[str] | None]]:
    """Per command, its flags and the values worth trying beside JUNK (None: a flag without a value)."""
    paths = [*files.values(), "/nonexistent/file", "/"]
    ports = ["0", "1", "65535", "65536", "99999999999999999999"]
    seconds = ["0.01", "1", "5", "1e6"]
    return {
        "run": {
            "--source": ["auto", "simulated", "sysfs", "nvml", "bogus"],
            "--sysfs-root": [files["sysfs"], "/nonexistent", "/"],
            "--devices": ["1", "2", "8"],
            "--fault": ["gpu-1:thermal@5", "*:stale", "gpu-99:thermal", "gpu-1:melted", "gpu-1:thermal@nan", ":"],
            "--interval": seconds,
            "--prometheus-port": ports,
            "--prometheus-host": ["127.0.0.1", "::1", "no such host"],
            "--otlp-endpoint": ["http://localhost:4317", "https://h:1", "localhost:4317", "http://", "://x"],
            "--otlp-protocol": ["grpc", "http/protobuf", "udp"],
            "--otlp-interval": seconds,
            "--otlp-queue-max-age": seconds,
            "--otlp-queue-max-points": ["1", "100000"],
            "--node-name": ["node-1", "a b"],
            "--seed": ["1", "-5"],
            "--policy": paths,
            "--health-attribute": ["metric", "all", "none"],
            "--kubelet-socket": ["/tmp/otel-dra-fuzz/dra.sock", "relative.sock"],
            "--kubelet-health-timeout": seconds,
            "--register-with-kubelet": ["fuzz.otel-dra.io", "Bad_Name"],
            "--plugin-registry": ["/nonexistent"],
            "--k8s-output": [files["dir"]],
            "--k8s-api-version": ["v1", "v1beta2", "v1alpha3", "v9"],
            "--k8s-driver": ["gpu.example.com"],
            "--k8s-apply": None,
            "--log-level": ["debug", "error", "loud"],
        },
        "fleet": {
            "--host": ["127.0.0.1", "::1", "no such host"],
            "--otlp-grpc-port": ports,
            "--otlp-http-port": ports,
            "--prometheus-port": ports,
            "--policy": paths,
            "--sample-interval": seconds,
            "--evaluate-every": seconds,
            "--max-request-bytes": ["1024", "1", "16777216"],
            "--max-future": seconds,
            "--tls-cert-file": [files["cert"], files["key"], *paths],
            "--tls-key-file": [files["key"], files["cert"], *paths],
            "--tls-client-ca-file": [files["ca"], *paths],
            "--log-level": ["info", "loud"],
        },
        "replay": {
            "": [files["recording"], files["garbage"], files["empty"], files["dir"], "/nonexistent/file"],
            "-o": [files["out"], "-", "/nonexistent/dir/out.jsonl"],
            "--policy": paths,
            "--strict": None,
            "--plot": ["/nonexistent/dir/x.png", files["dir"]],  # (a good one draws for seconds: test_replay's)
        },
        "policy check": {"": paths},
        "k8s render": {
            "": [files["verdicts"], files["garbage"], "/nonexistent/file"],
            "--from": ["http://127.0.0.1:1", "notaurl", "ftp://x"],
            "--policy": paths,
            "--api-version": ["v1beta2", "v1alpha3", "v9"],
            "--driver": ["gpu.example.com", "Bad_Name"],
            "--output": [files["dir"], "/nonexistent/dir"],
            "--only": ["taints", "attributes", "both"],
            "--timeout": ["0.5", "-1", "nan"],
        },
        "status": {"": ["http://127.0.0.1:1", "notaurl", "ftp://x", "http://[::1"], "--timeout": ["0.5", "0", "-1"]},
    }


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    point = {
        "attributes": [{"key": "hw.id", "value": {"stringValue": "gpu-0"}}],
        "timeUnixNano": "1795000000000000000",
        "asDouble": 100.0,
    }
    line = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "k8s.node.name", "value": {"stringValue": "n"}}]},
                "scopeMetrics": [{"metrics": [{"name": "hw.power", "unit": "W", "gauge": {"dataPoints": [point]}}]}],
            }
        ]
    }
    (tmp_path / "recording.jsonl").write_text(json.dumps(line) + "\n")
    (tmp_path / "garbage.bin").write_bytes(os.urandom(512))
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "good.yaml").write_text("min_samples: 3\n")
    (tmp_path / "bad.yaml").write_text("window: [1, 2]\n")
    verdict = {"time": "2026-11-18T00:00:00Z", "k8s.node.name": "n", "hw.id": "gpu-0", "health": "Unhealthy"}
    (tmp_path / "verdicts.jsonl").write_text(json.dumps(verdict) + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "sysfs").mkdir()
    names = {
        **{"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem", "recording": "recording.jsonl"},
        **{"garbage": "garbage.bin", "empty": "empty.jsonl", "policy": "good.yaml", "bad_policy": "bad.yaml"},
        **{"verdicts": "verdicts.jsonl", "dir": "out", "out": "verdicts-out.jsonl", "png": "timeline.png"},
        "sysfs": "sysfs",
    }
    return {key: str(tmp_path / name) for key, name in names.items()}


@st.composite
def command_lines(draw: st.DrawFn, flags: dict[str, dict[str, list[str] | None]]) -> list[str]:
    command = draw(st.sampled_from(sorted(flags)))
    options = flags[command]
    argv = command.split()
    if command == "run" and draw(st.booleans()):
        # --source auto exits 2 on a machine without accelerators (issue #15): half the agent's command
        # lines ask for the simulator, so that some of them get as far as a running agent anywhere.
        argv += ["--source", "simulated"]
    for flag in draw(st.lists(st.sampled_from(sorted(options)), max_size=5)):
        values = options[flag]
        if values is None:
            argv.append(flag)
            continue
        value = (
            draw(st.sampled_from(values) | st.sampled_from(JUNK))
            if draw(st.booleans())
            else draw(st.sampled_from(values))
        )
        argv += [value] if flag == "" else [flag, value]
    if draw(st.integers(0, 5)) == 0 and command != "policy check":
        argv.append(draw(st.sampled_from(["--no-such-flag", "extra-argument"])))
    return argv


def test_every_command_line_ends_in_0_or_one_error_line_with_2(files, monkeypatch, capsys):
    ran: list[str] = []
    monkeypatch.setattr(Agent, "run", lambda self: ran.append("run"))
    monkeypatch.setattr(Fleet, "run", lambda self: ran.append("fleet"))
    monkeypatch.setattr(cli_common, "stop_on_signals", lambda stop: None)
    for key in [k for k in os.environ if k.startswith(("OTEL_", "NODE_NAME"))]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(files["dir"])
    handlers, level = logging.getLogger().handlers[:], logging.getLogger().level
    flags = flag_values(files)
    seen_codes: set[int] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(command_lines(flags))
    def one(argv: list[str]) -> None:
        capsys.readouterr()
        try:
            cli_main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except click.exceptions.Exit as exc:  # pragma: no cover - main() turns these into SystemExit
            code = exc.exit_code
        finally:
            logging.getLogger().handlers[:] = handlers
            logging.getLogger().setLevel(level)
        out = capsys.readouterr()
        seen_codes.add(code)
        assert "Traceback" not in out.err and "Traceback" not in out.out, (argv, out.err[-2000:])
        assert code in (0, 2), (argv, code, out.err[-2000:])
        if code == 2:
            lines = [line for line in out.err.splitlines() if line.strip()]
            assert lines, (argv, "exit 2 without a word")
            last = lines[-1]
            assert last.startswith("otel-dra") and "error:" in last, (argv, last)
            if argv[0] != "replay":  # replay lists the first bad lines of its input above its verdict
                assert len(lines) == 1, (argv, lines)

    one()
    assert seen_codes == {0, 2}
    assert {"run", "fleet"} <= set(ran), "no command line got as far as a running agent and fleet"
