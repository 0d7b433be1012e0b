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
from otel_dra.cli.kubelet import kubelet as kubelet_group
from otel_dra.cli.scenario import register as register_scenario
from otel_dra.cli.state import state


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="otel-dra")
def cli() -> None:
    """Accelerator health for Kubernetes DRA, as OpenTelemetry hw.* metrics.

    `otel-dra run` starts the node agent: it samples the node's devices (NVML or sysfs;
    simulated GPUs only with --source simulated), serves the hw.* metrics to Prometheus
    on /metrics and pushes them over OTLP when an endpoint is set.
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: click in non-standalone mode, so every user error is one line and exit 2."""
    from otel_dra.cli.common import output_flag_hint

    prog = "otel-dra"
    try:
        cli.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:
        # A bare `otel-dra` (or `otel-dra k8s`): click's own answer, the help on stderr and exit 2; not an "error:".
        exc.show()
        sys.exit(USAGE_ERROR)
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else prog
        why = output_flag_hint(exc) or exc.format_message()
        click.echo(f"{cmd}: error: {why} (see '{cmd} --help')", err=True)
        sys.exit(USAGE_ERROR)
    except click.ClickException as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(USAGE_ERROR)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


#: Commands whose options read no environment variable, and why.
NO_ENVIRONMENT: dict[str, str] = {
    "simulate": "an offline generator run by hand: its files must follow from the command line alone",
    "score": "an offline scorer run by hand: a benchmark's figures must follow from the command line alone",
}
#: Options of any command that read no environment variable, and why.
NO_ENVIRONMENT_OPTIONS: dict[str, str] = {
    "help": "prints the help and exits: not a setting",
    "version": "prints the version and exits: not a setting",
}
#: Options shared by several commands that read one variable whatever the command.
SHARED_ENVIRONMENT: dict[str, str] = {"policy_file": "OTEL_DRA_POLICY"}


def give_every_option_an_environment_variable(command: click.Command, prefix: str = "OTEL_DRA_") -> None:
    """``<prefix><LONG_FLAG>`` for every option of ``command`` that has none yet (the container way to
    configure it), shown in ``--help``: ``run --interval`` reads ``OTEL_DRA_INTERVAL``, ``status
    --timeout`` ``OTEL_DRA_STATUS_TIMEOUT``."""
    for param in command.params:
        if not isinstance(param, click.Option) or param.envvar or param.name in NO_ENVIRONMENT_OPTIONS:
            continue
        flag = max((o for o in param.opts if o.startswith("--")), key=len, default=None)
        if flag is None:
            continue
        param.envvar = SHARED_ENVIRONMENT.get(param.name or "") or (
            prefix + flag.removeprefix("--").replace("-", "_").upper()
        )
        param.show_envvar = "[env:" not in (param.help or "")


def environment_prefix(path: tuple[str, ...]) -> str:
    """The services (``run``, ``fleet``) read ``OTEL_DRA_<FLAG>``, as they share most flags; every other
    command ``OTEL_DRA_<COMMAND>_<FLAG>`` (``k8s render --output``: ``OTEL_DRA_K8S_RENDER_OUTPUT``), so
    no variable means one thing to one command and another to the next."""
    if path in (("run",), ("fleet",)):
        return "OTEL_DRA_"
    return "OTEL_DRA_" + "_".join(p.replace("-", "_").upper() for p in path) + "_"


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group`` (groups too), with its path: [(("k8s",), k8s), (("k8s", "render"), ...)]."""
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in group.commands.items():
        out.append(((*path, name), command))
        if isinstance(command, click.Group):
            out.extend(_commands(command, (*path, name)))
    return out


for command in (run, fleet, replay, policy, status, k8s_group, kubelet_group, state):
    cli.add_command(command)
register_scenario(cli)  # simulate, score (otel_dra/cli/scenario.py)
for path, command in _commands(cli):
    if not any(p.name == "version" for p in command.params):  # `otel-dra run --version` as `otel-dra --version`
        click.version_option(__version__, prog_name="otel-dra")(command)
    if path[0] not in NO_ENVIRONMENT:
        give_every_option_an_environment_variable(command, environment_prefix(path))

__all__ = ["NO_ENVIRONMENT", "NO_ENVIRONMENT_OPTIONS", "USAGE_ERROR", "cli", "main"]
