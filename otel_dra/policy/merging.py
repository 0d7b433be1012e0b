"""Merging a user's policy over the default, and the read-only copies a policy is handed out as."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

#: Maps whose keys are data (not schema): a user's table replaces the default's whole.
#: (Lists, load_bins and slot_by among them, are always replaced whole: merge only merges mappings.)
REPLACED_WHOLE = frozenset({"code_tables", "minimum", "replays_per_lane_per_minute"})


def merge(
    base: Mapping[str, Any], override: Mapping[str, Any], replaced: frozenset[str] = REPLACED_WHOLE
) -> dict[str, Any]:
    """Deep merge into plain dicts: mappings merge key by key (but those named in ``replaced``),
    anything else is replaced."""
    out: dict[str, Any] = thawed(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key not in replaced:
            out[key] = merge(out[key], value, replaced)
        else:
            out[key] = thawed(value)
    return out


def thawed(value: Any) -> Any:
    """A plain, independent copy (dicts and lists) of a value, frozen or not."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thawed(v) for v in value]
    return value


def frozen(value: Any) -> Any:
    """A read-only copy: mappings become mapping proxies and lists tuples, so no reader can
    change the policy under another."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    return value


def plain(value: Any) -> Any:
    """Plain YAML-able data (keys as strings, but whole numbers), for dumping."""
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, int) else k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
