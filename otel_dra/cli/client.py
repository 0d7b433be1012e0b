"""The one client of ``/v1/devices``, for every command that reads a running agent or fleet."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from otel_dra.sinks.config import EndpointConfig

#: The port of a URL given without a scheme or a port: the agent's and the fleet's default.
DEFAULT_PORT = EndpointConfig.port

#: How an agent's address may be written, for error messages.
URL_FORMS = f"http://HOST:PORT, HOST:PORT, HOST (port {DEFAULT_PORT}) or :PORT (this host)"


def base_url(url: str) -> str:
    """What a user typed for an agent or fleet → ``http(s)://host:port[/path]``; a :class:`ValueError`
    saying what is wrong otherwise.

    Without a scheme, ``http://`` is assumed and a missing port is the endpoint's default:
    ``node7`` → ``http://node7:9464``, ``node7:8080`` → ``http://node7:8080`` and ``:8080`` →
    ``http://localhost:8080``. With one, the URL is taken as written (only http and https)."""
    text = url.strip()
    if not text:
        raise ValueError("empty")
    if any(c.isspace() for c in text):
        raise ValueError("it contains a space")
    schemeless = "://" not in text
    if schemeless and re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:/", text):
        raise ValueError("write the scheme as http://")
    if schemeless:
        text = "http://" + ("localhost" + text if text.startswith(":") else text)
    parts = urllib.parse.urlsplit(text)  # ValueError on an unclosed [IPv6 bracket
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{parts.scheme or 'no'} scheme; otel-dra serves http:// (or https:// behind a proxy)")
    host = parts.hostname
    if not host:
        raise ValueError("no host")
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError(f"{host[:40]!r}{'...' if len(host) > 40 else ''} is not a host name") from None
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the port is not a number from 0 to 65535") from None
    if schemeless and port is None:
        if parts.netloc.endswith(":"):
            raise ValueError("no port after ':'")
        parts = parts._replace(netloc=f"{parts.netloc}:{DEFAULT_PORT}")
    return urllib.parse.urlunsplit(parts)


def devices_url(url: str) -> str:
    """``http://host:9464`` or ``http://host:9464/v1/devices`` → the latter."""
    base = url.rstrip("/")
    return base if base.endswith("/v1/devices") else base + "/v1/devices"


def read_devices(url: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    """(the endpoint read, its JSON document with a ``devices`` list); a one-line
    :class:`click.ClickException` saying what went wrong and what to check. ``url`` may be
    written any way :func:`base_url` takes."""
    try:
        endpoint = devices_url(base_url(url))
    except ValueError as exc:
        raise click.ClickException(f"{url!r} is not an agent's URL ({exc}); write {URL_FORMS}") from None
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            doc = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        serving = "is 'otel-dra run' or 'otel-dra fleet' serving there?"
        raise click.ClickException(f"cannot read {endpoint}: {reason}; {serving}") from None
    except ValueError as exc:
        raise click.ClickException(f"{endpoint} did not answer with JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise click.ClickException(f"{endpoint} did not answer with otel-dra's device list (no 'devices' list)")
    return endpoint, doc
