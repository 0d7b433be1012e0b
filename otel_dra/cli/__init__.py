"""The ``otel-dra`` command line: one module per command, registered on one group here.

User mistakes (a bad flag, a bad ``--fault``, a port in use) end in one line on
stderr naming what is wrong and how to fix it, with exit code 2; never a traceback.
"""

from __future__ import annotations

import sys

import click

from otel_dra import __version__
from otel_dra.cli.cmd_fleet import fleet
from otel_dra.cli.cmd_policy import policy
from otel_dra.cli.cmd_replay import replay
from otel_dra.cli.cmd_run import run
from otel_dra.cli.cmd_status import status
from otel_dra.cli.common import USAGE_ERROR
from otel_dra.cli.k8s import k8s as k8s_group
from otel_dra.cli.scenario import register as register_scenario


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="otel-dra")
def cli() -> None:
    """Accelerator health for Kubernetes DRA, as OpenTelemetry hw.* metrics.

    `otel-dra run` starts the node agent: it samples devices (a simulated fleet by
    default), serves the hw.* metrics to Prometheus on /metrics and pushes them over
    OTLP when an endpoint is set.
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: click in non-standalone mode, so every user error is one line and exit 2."""
    prog = "otel-dra"
    try:
        cli.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else prog
        click.echo(f"{cmd}: error: {exc.format_message()} (see '{cmd} --help')", err=True)
        sys.exit(USAGE_ERROR)
    except click.ClickException as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(USAGE_ERROR)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


def give_every_option_an_environment_variable(command: click.Command) -> None:
    """``OTEL_DRA_<LONG_FLAG>`` for every option of a long-running command that has none yet (the
    container way to configure it), shown in ``--help``: ``--interval`` reads ``OTEL_DRA_INTERVAL``."""
    for param in command.params:
        if not isinstance(param, click.Option) or param.envvar or param.name in ("help", "version"):
            continue
        flag = max((o for o in param.opts if o.startswith("--")), key=len, default=None)
        if flag is None:
            continue
        param.envvar = "OTEL_DRA_" + flag.removeprefix("--").replace("-", "_").upper()
        param.show_envvar = "[env:" not in (param.help or "")


for command in (run, fleet, replay, policy, status, k8s_group):
    cli.add_command(command)
for service in (run, fleet):
    give_every_option_an_environment_variable(service)
register_scenario(cli)  # simulate, score (otel_dra/cli/scenario.py)

__all__ = ["USAGE_ERROR", "cli", "main"]
