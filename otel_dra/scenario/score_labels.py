"""The scorer's inputs: a labels file, checked once (every problem one line naming it), and verdict lines.

Why checked up front: a scorer that meets a bad label halfway through has already counted half the
figures; checking the whole document first makes every later read a plain lookup.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class LabelsError(ValueError):
    """Labels that can't be scored against; the message is one line naming what is wrong."""


def label_time(value: Any) -> int | None:
    """A label's time: an integer, a whole float or a string of digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _require(doc: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise LabelsError(f"{where} has no {key!r}")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise LabelsError(f"{where} {key!r} is {type(value).__name__} {_short(value)}, not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {"int": "an integer", "float": "a number", "str": "a string", "list": "a list"}.get(k.__name__, k.__name__)
        for k in kinds
    )


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_labels(labels: Any) -> None:
    """Raise :class:`LabelsError` (one line) unless ``labels`` has what scoring reads."""
    if not isinstance(labels, dict):
        raise LabelsError(f"labels are a JSON {type(labels).__name__}, not an object")
    step = _require(labels, "interval_s", "labels", (int, float))
    if not step > 0:
        raise LabelsError(f"labels 'interval_s' must be more than 0, got {step}")
    _require(labels, "t0_unix_nano", "labels", int)
    if _require(labels, "ticks", "labels", int) < 1:
        raise LabelsError("labels 'ticks' must be at least 1")
    for i, f in enumerate(_require(labels, "faults", "labels", list)):
        where = f"labels faults[{i}]"
        if not isinstance(f, dict):
            raise LabelsError(f"{where} is not an object")
        for key in ("k8s.node.name", "hw.id", "kind"):
            _require(f, key, where, str)
        reasons = _require(f, "reasons", where, list)
        if not reasons or not all(isinstance(r, str) for r in reasons):
            raise LabelsError(f"{where} 'reasons' must be a non-empty list of strings")
        if _require(f, "severity", where, str) not in ("hard", "soft"):
            raise LabelsError(f"{where} 'severity' must be hard or soft, got {_short(f['severity'])}")
        if _require(f, "deadline_s", where, (int, float)) < 0:
            raise LabelsError(f"{where} 'deadline_s' must be 0 or more")
        _require(f, "onset_unix_nano", where, int)
        if "end_unix_nano" in f and f["end_unix_nano"] is not None:
            _require(f, "end_unix_nano", where, int)
        for key in ("scope", "group", "remediation"):
            if f.get(key) is not None:
                _require(f, key, where, str)
        _check_devices(f, where)
    devices = _require(labels, "devices", "labels", list)
    if not devices:
        raise LabelsError("labels 'devices' is empty: nothing to score")
    for i, d in enumerate(devices):
        if not isinstance(d, dict):
            raise LabelsError(f"labels devices[{i}] is not an object")
        _require(d, "k8s.node.name", f"labels devices[{i}]", str)
        _require(d, "hw.id", f"labels devices[{i}]", str)
    silence = labels.get("node_silence")
    if silence is not None:
        if not isinstance(silence, dict):
            raise LabelsError("labels 'node_silence' is not an object")
        _require(silence, "node", "labels node_silence", str)
        _require(silence, "from_unix_nano", "labels node_silence", int)
        _require(silence, "to_unix_nano", "labels node_silence", int)
    for key in ("traps", "nodes"):
        if not isinstance(labels.get(key, []), list):
            raise LabelsError(f"labels {key!r} is not a list")


def _check_devices(f: Mapping[str, Any], where: str) -> None:
    """A firmware fault's ``devices`` and ``lost_devices`` (each a node and hw.id) and ``events`` (each also a time),
    when there."""
    for key in ("devices", "lost_devices", "events"):
        items = f.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise LabelsError(f"{where} {key!r} is not a list")
        for j, item in enumerate(items):
            if not isinstance(item, dict):
                raise LabelsError(f"{where} {key}[{j}] is not an object")
            _require(item, "k8s.node.name", f"{where} {key}[{j}]", str)
            _require(item, "hw.id", f"{where} {key}[{j}]", str)
            if key == "events":
                _require(item, "at_unix_nano", f"{where} {key}[{j}]", int)


def load_labels(path: Path | str) -> dict[str, Any]:
    """Read and check a labels file; :class:`LabelsError` (one line, naming the file) if it can't be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise LabelsError(f"{path}: not UTF-8 text") from None
    try:
        labels = json.loads(text)
    except ValueError as exc:
        raise LabelsError(f"{path}: not JSON ({exc})") from None
    try:
        check_labels(labels)
    except LabelsError as exc:
        raise LabelsError(f"{path}: {exc}") from None
    return labels


def read_verdict_lines(path: Path | str) -> Iterator[Any]:
    """Each non-empty line of a verdict file, parsed (``None`` for a line that isn't JSON).

    Raises ``OSError`` when the file can't be opened or read.
    """
    with Path(path).open("rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                yield json.loads(raw)
            except ValueError:
                yield None
