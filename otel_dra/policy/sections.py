"""Top-level policy sections other packages own, and how their owners hand them in.

A section's rules are its consumer's (the Kubernetes API's, for ``kubernetes``), so the policy
never imports the consumer: the owner builds a :class:`Section` and registers it when imported
(:func:`register_section`), and each pipeline or command passes the sections it is built with to
:func:`~otel_dra.policy.load` (as a Collector distribution passes in its factories). Either way
the owner is reached by a plain import from above; the policy knows only each section's name,
for its place among the keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml

from otel_dra.policy.validators import Validator, Where, constructed

#: Checks across a merged section's keys; raises PolicyError naming the source.
Check = Callable[[Mapping[str, Any], str], None]


@dataclass(frozen=True)
class Section:
    """A top-level section whose keys a consumer owns: the consumer knows its rules (the
    Kubernetes API's, for ``kubernetes``), so the policy need not import it."""

    schema: Validator
    #: Checks across the merged section's keys; raises PolicyError naming the source.
    check: Check | None = None
    #: Keys whose tables are data, not schema: a user's table replaces the default's whole.
    replaced_whole: frozenset[str] = frozenset()


#: The top-level keys another package owns (their place among the policy's keys).
OWNED_SECTIONS: tuple[str, ...] = ("kubernetes",)
_REGISTERED: dict[str, Section] = {}


def register_section(name: str, section: Section) -> None:
    """Called by an owner at import: its section's schema and checks, for a load given no sections."""
    _known(name)
    _REGISTERED[name] = section


def in_effect(sections: Mapping[str, Section] | None) -> Mapping[str, Section]:
    """The sections a load validates: those passed in, or (None) those registered so far."""
    if sections is None:
        return MappingProxyType(dict(_REGISTERED))
    for name in sections:
        _known(name)
    return sections


def _known(name: str) -> None:
    if name not in OWNED_SECTIONS:
        raise ValueError(f"{name!r} is not a policy section; owned sections: {', '.join(OWNED_SECTIONS)}")


def as_read(node: yaml.Node, key: str, where: Where) -> dict[str, Any]:
    """An owned section loaded without its owner: kept as read (plain YAML, unchecked), for a
    pipeline that does not use it. Every pipeline that does passes its owner in."""
    if not isinstance(node, yaml.MappingNode):
        raise where(node, f"{key}: expected a mapping")
    value: dict[str, Any] = constructed(node, key, where)
    return value
