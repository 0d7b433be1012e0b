"""Fixtures the Kubernetes sink tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_apiserver import FakeApiServer, write_kubeconfig


@pytest.fixture
def api(tmp_path, monkeypatch) -> Iterator[FakeApiServer]:
    """A fake API server on loopback, and ``KUBECONFIG`` pointing at it (what ``connect()`` reads)."""
    server = FakeApiServer()
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(server, tmp_path)))
    yield server
    server.close()
