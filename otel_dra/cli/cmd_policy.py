"""``otel-dra policy``: validate a policy file and show the effective policy."""

from __future__ import annotations

import click

from otel_dra.cli.common import load_policy


@click.group()
def policy() -> None:
    """Health policy files: validate and show the effective policy."""


@policy.command("check")
@click.argument("file", required=False)
def policy_check(file: str | None) -> None:
    """Validate FILE (merged over the default) and print the effective policy as YAML.

    Without FILE, prints the default policy. An unknown key, a wrong type or a bad value is
    one error line naming the file position and key, with exit code 2.
    """
    click.echo(load_policy(file).to_yaml(), nl=False)
