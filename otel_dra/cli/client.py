"""The one client of ``/v1/devices``, for every command that reads a running agent or fleet."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click


def devices_url(url: str) -> str:
    """``http://host:9464`` or ``http://host:9464/v1/devices`` → the latter."""
    base = url.rstrip("/")
    return base if base.endswith("/v1/devices") else base + "/v1/devices"


def read_devices(url: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    """(the endpoint read, its JSON document with a ``devices`` list); a one-line
    :class:`click.ClickException` saying what went wrong and what to check."""
    endpoint = devices_url(url)
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            doc = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(f"cannot read {endpoint}: {reason}; is 'otel-dra run' serving there?") from None
    except ValueError as exc:
        raise click.ClickException(f"{endpoint} did not answer with JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise click.ClickException(f"{endpoint} did not answer with otel-dra's device list (no 'devices' list)")
    return endpoint, doc
