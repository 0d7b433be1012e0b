"""The policy sections the sinks own, listed in one place, and the load every pipeline and command uses.

As a Collector distribution lists the factories it is built with and passes them in, this module
lists each section's owner by a plain import and passes them to :func:`otel_dra.policy.load`: so
every section is validated by its owner, whatever else was imported, and the architecture test
sees every edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from otel_dra import policy
from otel_dra.sinks.k8s import settings as k8s_settings

#: Every owned section, by name: what the agent, the fleet and the commands load a policy with.
SECTIONS: Mapping[str, policy.Section] = MappingProxyType({k8s_settings.SECTION: k8s_settings.POLICY_SECTION})


def load_policy(path: Path | str | None = None) -> policy.Policy:
    """The default policy with ``path`` (if given) merged over it, each section checked by its owner."""
    return policy.load(path, SECTIONS)
