"""Loading a policy: the default, a user's file merged over it, and the checks no single key shows.

YAML is read with the safe loader and nothing in it is ever evaluated; the whole file is validated
before anything runs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from otel_dra.policy.merging import REPLACED_WHOLE, merge
from otel_dra.policy.model import Policy
from otel_dra.policy.schema import EVENT_LOG_DEPTH, EVENT_THRESHOLDS, HORIZON_MAX_BUCKETS, schema_for
from otel_dra.policy.sections import Section, in_effect
from otel_dra.policy.validators import PolicyError, where_in

DEFAULT_POLICY = "default.yaml"


def default_text() -> str:
    """The default policy's YAML, as shipped in :mod:`otel_dra.policy`."""
    return resources.files("otel_dra.policy").joinpath(DEFAULT_POLICY).read_text()


#: What reads the shipped default: libyaml's parser where PyYAML has it (a twentieth of the pure-Python one's time,
#: ~50 ms of each command's start). A user's file is read by the pure-Python one: its errors' wording is the one
#: the messages quote, and nesting too deep for a policy is a RecursionError there, not the C parser's stack.
_SHIPPED_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse(
    text: str, source: str, sections: Mapping[str, Section] | None = None, *, loader: type[Any] = yaml.SafeLoader
) -> dict[str, Any]:
    """Validate one policy document; returns the keys it sets (not merged). ``sections``: as :func:`load`.
    ``loader``: the safe loader that composes it (the shipped default's: :data:`_SHIPPED_LOADER`)."""
    try:
        node = yaml.compose(text, Loader=loader)
    except RecursionError:
        raise PolicyError(
            f"{source}: nested too deeply to be a policy (a policy is a few levels of mappings)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyError(f"{source}:{pos}not valid YAML: {problem}") from None
    if node is None:
        return {}
    return schema_for(in_effect(sections))(node, "", where_in(source))


#: The default policy's keys as validated, by the sections in effect: the shipped text does not change while a process
#: runs, so it is parsed once (most of a load's time: a test suite or a tool that loads many policies pays it once),
#: and each load gets its own copy. The last few sets of sections are kept (most processes use one).
_DEFAULT_DATA: dict[tuple[tuple[str, Section], ...], dict[str, Any]] = {}
_DEFAULTS_KEPT = 4


def _default_data(owners: Mapping[str, Section]) -> dict[str, Any]:
    """The default policy's keys as :func:`parse` gives them under ``owners``: a copy of the kept ones."""
    key = tuple(sorted(owners.items()))  # (names are unique: the sections themselves are never compared)
    data = _DEFAULT_DATA.get(key)
    if data is None:
        data = parse(default_text(), f"<default policy {DEFAULT_POLICY}>", owners, loader=_SHIPPED_LOADER)
        while len(_DEFAULT_DATA) >= _DEFAULTS_KEPT:
            del _DEFAULT_DATA[next(iter(_DEFAULT_DATA))]
        _DEFAULT_DATA[key] = data
    return copy.deepcopy(data)


def load(path: Path | str | None = None, sections: Mapping[str, Section] | None = None) -> Policy:
    """The default policy, with ``path`` (if given) merged over it.

    ``sections``: the owned sections' rules, by name, that the caller is built with (a pipeline
    passes its own); None takes those registered so far. A section with no rules given is kept as read.
    """
    owners = in_effect(sections)
    data = _default_data(owners)
    source = "<default>"
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a policy is YAML") from None
        replaced = REPLACED_WHOLE.union(*(owner.replaced_whole for owner in owners.values()))
        data = merge(data, parse(text, str(path), owners), replaced)
        source = str(path)
    _check_consistency(data, source, owners)
    return Policy.from_data(data, source)


def _check_consistency(data: Mapping[str, Any], source: str, sections: Mapping[str, Section]) -> None:
    for rules in (data["rules"], *(o.get("rules", {}) for o in data["overrides"])):
        for reason, key in EVENT_THRESHOLDS:
            value = rules.get(reason, {}).get(key)
            if value is not None and value > EVENT_LOG_DEPTH:
                raise PolicyError(
                    f"{source}: rules.{reason}.{key} ({value}) is above the {EVENT_LOG_DEPTH} events kept per "
                    f"device; use at most {EVENT_LOG_DEPTH}"
                )
    hz = data["horizon"]
    if not 1.0 <= hz["bucket"] <= hz["duty_span"] <= hz["rate_span"]:
        raise PolicyError(
            f"{source}: horizon: need 1s <= bucket ({hz['bucket']:g}s) <= duty_span ({hz['duty_span']:g}s) "
            f"<= rate_span ({hz['rate_span']:g}s)"
        )
    if hz["rate_span"] / hz["bucket"] > HORIZON_MAX_BUCKETS:
        raise PolicyError(
            f"{source}: horizon: rate_span / bucket is {hz['rate_span'] / hz['bucket']:.0f} buckets per device; "
            f"use at most {HORIZON_MAX_BUCKETS} (a longer bucket or a shorter span)"
        )
    bins = data["cohorts"]["load_bins"]
    if any(b <= a for a, b in itertools.pairwise(bins)):
        raise PolicyError(f"{source}: cohorts.load_bins must increase, got {bins}")
    ecc = data["rules"]["memory_ecc"]
    if ecc["retired_pages_predicted"] > ecc["retired_pages_failed"]:
        raise PolicyError(
            f"{source}: rules.memory_ecc.retired_pages_predicted ({ecc['retired_pages_predicted']}) must not exceed "
            f"retired_pages_failed ({ecc['retired_pages_failed']})"
        )
    for name, section in sections.items():
        if section.check is not None:
            section.check(data[name], source)
