"""Health policy as data: load, validate, merge over the default, resolve per device model.

The whole file is validated before anything runs: an unknown key, a wrong type or a bad
value is one :class:`PolicyError` naming the file, line, column and key, and what would be
valid. A user file is merged over ``policy/default.yaml``, so it only needs the keys it
changes. YAML is read with the safe loader and nothing in it is ever evaluated.

One concept a module: :mod:`~otel_dra.policy.validators` (the building blocks and the error),
:mod:`~otel_dra.policy.schema` (every key), :mod:`~otel_dra.policy.sections` (the sections other
packages own), :mod:`~otel_dra.policy.merging`, :mod:`~otel_dra.policy.model` (the typed policy)
and :mod:`~otel_dra.policy.loading`. The names below are the ones importers use.
"""

from __future__ import annotations

from otel_dra.policy.loading import DEFAULT_POLICY, default_text, load, parse
from otel_dra.policy.merging import REPLACED_WHOLE, merge
from otel_dra.policy.model import (
    Cohorts,
    Escalation,
    FirmwareScope,
    Horizon,
    LinkScope,
    NodeScope,
    Override,
    Policy,
    Rules,
    SharedDevices,
    WorkloadScope,
)
from otel_dra.policy.schema import (
    CLEAR_MODES,
    DRIVER_CLASSES,
    EVENT_LOG_DEPTH,
    EVENT_REASONS,
    EVENT_THRESHOLDS,
    HORIZON_MAX_BUCKETS,
    NODE_SCOPE_REASONS,
    RULE_STATES,
    RULES,
    RULES_KEYS,
    schema_for,
)
from otel_dra.policy.sections import OWNED_SECTIONS, Check, Section, register_section
from otel_dra.policy.validators import (
    COUNT,
    FRACTION,
    POSITIVE,
    PolicyError,
    Validator,
    Where,
    boolean,
    duration,
    list_of,
    map_of,
    number,
    one_of,
    parse_duration,
    positive_duration,
    show,
    string,
    struct,
)

__all__ = [
    "CLEAR_MODES",
    "COUNT",
    "DEFAULT_POLICY",
    "DRIVER_CLASSES",
    "EVENT_LOG_DEPTH",
    "EVENT_REASONS",
    "EVENT_THRESHOLDS",
    "FRACTION",
    "HORIZON_MAX_BUCKETS",
    "NODE_SCOPE_REASONS",
    "OWNED_SECTIONS",
    "POSITIVE",
    "REPLACED_WHOLE",
    "RULES",
    "RULES_KEYS",
    "RULE_STATES",
    "Check",
    "Cohorts",
    "Escalation",
    "FirmwareScope",
    "Horizon",
    "LinkScope",
    "NodeScope",
    "Override",
    "Policy",
    "PolicyError",
    "Rules",
    "Section",
    "SharedDevices",
    "Validator",
    "Where",
    "WorkloadScope",
    "boolean",
    "default_text",
    "duration",
    "list_of",
    "load",
    "map_of",
    "merge",
    "number",
    "one_of",
    "parse",
    "parse_duration",
    "positive_duration",
    "register_section",
    "schema_for",
    "show",
    "string",
    "struct",
]
