"""The configs name their fields, the CLI its flags: one table (otel_dra/cli/flags.py) maps each to the other."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from otel_dra.cli import cli
from otel_dra.cli.flags import FLAGS, usage_error
from otel_dra.component import ConfigError
from otel_dra.config import AgentConfig, FleetConfig
from otel_dra.receivers.config import ReceiverConfig

PACKAGE = Path(__file__).resolve().parents[3] / "otel_dra"
FIELD = re.compile(r"\{\{?([A-Z]\w*(?:Config|Settings|Limits))\.([a-z_]\w*)\}")


def test_every_field_a_config_error_names_has_its_flag():
    named = {f"{m[1]}.{m[2]}" for p in PACKAGE.rglob("*.py") for m in FIELD.finditer(p.read_text())}
    assert named and named <= set(FLAGS), sorted(named - set(FLAGS))


def test_every_flag_of_the_table_is_a_flag_of_run_or_fleet_and_every_field_a_field():
    flags = {
        o for name in ("run", "fleet") for p in cli.commands[name].params if isinstance(p, click.Option) for o in p.opts
    }
    assert set(FLAGS.values()) <= flags, sorted(set(FLAGS.values()) - flags)
    import otel_dra.config as configs
    import otel_dra.decode.limits as limits
    import otel_dra.receivers.config as receiver
    import otel_dra.receivers.tls as tls
    import otel_dra.serve.config as serve
    import otel_dra.sinks.config as sinks
    import otel_dra.sinks.k8s.lease as lease

    modules = (configs, receiver, serve, sinks, limits, tls, lease)
    classes = {n: c for m in modules for n, c in vars(m).items() if dataclasses.is_dataclass(c)}
    for key in FLAGS:
        cls, field = key.split(".")
        assert field in {f.name for f in dataclasses.fields(classes[cls])}, key


def test_a_config_error_names_the_field_and_the_cli_the_flag():
    with pytest.raises(ConfigError) as err:
        FleetConfig(max_queued_points=0)
    assert str(err.value) == "max_queued_points must be at least 1, got 0"
    assert usage_error(err.value).message == "--max-queued-points must be at least 1, got 0"
    with pytest.raises(ConfigError) as err:
        ReceiverConfig(grpc_port=70000)
    assert usage_error(err.value).message.startswith("--otlp-grpc-port must be a TCP port")
    with pytest.raises(ConfigError) as err:
        AgentConfig("n", interval_s=0)
    assert str(err.value).startswith("interval_s must be") and "--interval" in usage_error(err.value).message


@pytest.mark.parametrize(
    ("args", "env", "fork"),
    [([], {}, True), (["--no-render-fork"], {}, False), ([], {"OTEL_DRA_RENDER_FORK": "false"}, False)],
)
def test_render_fork_reaches_the_fleets_config(monkeypatch, args, env, fork):
    from otel_dra.cli.cmd_fleet import fleet
    from otel_dra.cli.pipeline_configs import fleet_config

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert fleet_config(fleet.make_context("fleet", list(args)).params).render_fork is fork


def test_render_fork_help_names_the_fleet_size_it_starts_at():
    """The help says the size in words of its own (importing the renderer for it would cost every command's
    start ~0.15 s): this keeps the two in step."""
    from otel_dra.cli.cmd_fleet import fleet
    from otel_dra.sinks.verdict_text import LARGE_DEVICES

    [option] = [p for p in fleet.params if p.name == "render_fork"]
    assert f"{LARGE_DEVICES:,} devices or more" in (option.help or "")
