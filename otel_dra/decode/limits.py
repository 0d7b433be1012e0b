"""Bounds on what input may create: how many nodes, devices and series, and how long a value.

One client (a broken agent, an attacker, a replay file written by hand) must not be able to make
the fleet hold millions of devices or a megabyte-long label. These are the caps, with the
Collector's conventions: past a cap the points are rejected and counted by reason (OTLP partial
success, a counter on ``/metrics``, replay's skip count); what was already known keeps working.

Light on purpose (no numpy): the CLI reads the defaults from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from otel_dra.component import ConfigError

#: Why points were refused by a cap (the ``reason`` attribute of ``otel_dra.receiver.refused``).
NODE_NAME: Final = "node_name"  # k8s.node.name is not a DNS subdomain of at most 253 characters
NODES: Final = "nodes"  # a new node past max_nodes
DEVICES: Final = "devices"  # a new device past max_devices (the whole fleet)
DEVICES_PER_NODE: Final = "devices_per_node"  # a new device of a node past max_devices_per_node
SERIES: Final = "series"  # a new series kind (metric + attributes: a column) past max_series
ATTRIBUTE_LENGTH: Final = "attribute_length"  # an identity attribute (hw.id, hw.parent) over max_attribute_length
#: The request's client may not report for that node: its certificate names another one (otel_dra.receivers.auth).
FORBIDDEN_NODE: Final = "forbidden_node"
LIMIT_REASONS: Final = (FORBIDDEN_NODE, NODE_NAME, NODES, DEVICES, DEVICES_PER_NODE, SERIES, ATTRIBUTE_LENGTH)

#: Kubernetes' limit for a node's name: a DNS subdomain (RFC 1123), at most 253 characters.
NODE_NAME_MAX: Final = 253
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name_problem(node: str) -> str | None:
    """Why ``node`` can't be a Kubernetes node's name (None: it can), in Kubernetes' own words."""
    if len(node) > NODE_NAME_MAX:
        return f"must be no more than {NODE_NAME_MAX} characters (it has {len(node):,})"
    if not _DNS_SUBDOMAIN.fullmatch(node):
        return (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return None


def shorten(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters, the cut marked with an ellipsis (descriptive values only:
    an identity cut short could merge two devices)."""
    return value if len(value) <= limit else value[: max(0, limit - 1)] + "…"


@dataclass(frozen=True)
class DecodeLimits:
    """The caps (see the module docstring). Defaults fit one fleet replica with room to spare:
    BENCHMARKS.md's soak runs 100,000 devices (12,500 nodes of 8 GPUs) on one replica."""

    max_devices_per_node: int = 256
    max_nodes: int = 16_384
    max_devices: int = 131_072
    #: Distinct series kinds (metric + attribute set: the window arrays' columns), fleet-wide: a device
    #: can have no more series than this. The contract's metrics need a few dozen per model.
    max_series: int = 1_024
    #: Attribute values longer than this are shortened (descriptive) or refused (identity: hw.id, hw.parent),
    #: as ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` bounds them in an SDK.
    max_attribute_length: int = 256

    def __post_init__(self) -> None:
        for field, value in (
            ("{DecodeLimits.max_devices_per_node}", self.max_devices_per_node),
            ("{DecodeLimits.max_nodes}", self.max_nodes),
            ("{DecodeLimits.max_devices}", self.max_devices),
            ("{DecodeLimits.max_series}", self.max_series),
            ("{DecodeLimits.max_attribute_length}", self.max_attribute_length),
        ):
            if value < 1:
                raise ConfigError(f"{field} must be at least 1, got {value}")


#: The caps when none are given (frozen: one instance serves every decoder).
DEFAULT_LIMITS: Final = DecodeLimits()
