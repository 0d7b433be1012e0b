"""The README's commands work as written (issue #15): every ``otel-dra`` command line in its shell
blocks names a real command and only that command's real options, every ``pip install`` installs
from the clone with extras that exist, and the venv is activated before the first bare ``otel-dra``."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import click

from otel_dra.cli import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def shell_lines() -> list[str]:
    """The README's ``sh`` blocks, one logical line each (continuations joined, comments dropped)."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip().rstrip("&").strip()
            if line:
                lines.append(line)
    return lines


def otel_dra_commands() -> list[list[str]]:
    """The argv of every ``otel-dra`` invocation (after ``&&`` too), without the program name."""
    found = []
    for line in shell_lines():
        for part in line.split("&&"):
            words = shlex.split(part)
            for i, word in enumerate(words):
                if word.endswith("otel-dra"):
                    found.append(words[i + 1 :])
                    break
    return found


def resolve(argv: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = cli
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        assert sub is not None, f"README runs 'otel-dra {' '.join(argv)}': no command {rest[0]!r}"
        command, rest = sub, rest[1:]
    return command, rest


def test_every_readme_command_uses_real_commands_and_options():
    commands = otel_dra_commands()
    assert len(commands) > 15
    for argv in commands:
        command, rest = resolve(argv)
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help", "--version"}
        for word in rest:
            flag = word.split("=", 1)[0]
            if flag.startswith("--"):
                assert flag in known, f"README runs 'otel-dra {' '.join(argv)}': {command.name} has no {flag}"


def test_pip_installs_come_from_the_clone_with_extras_that_exist():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installs = re.findall(r"pip install[^`\n]*", README)
    assert installs
    for line in installs:
        assert " -e " in f" {line} ", f"README's {line!r} would look for otel-dra on PyPI: install from the clone"
        for named in re.findall(r"\.\[([a-z0-9,]+)\]", line):
            assert set(named.split(",")) <= extras, line
    for extra in ("nvidia", "k8s", "plot"):
        assert f"'.[{extra}]'" in README, f"the [{extra}] extra is not documented"


def test_the_venv_is_activated_before_the_first_bare_otel_dra():
    lines = shell_lines()
    first_bare = next(i for i, line in enumerate(lines) if re.match(r"otel-dra\b", line))
    assert any(". .venv/bin/activate" in line for line in lines[:first_bare])
