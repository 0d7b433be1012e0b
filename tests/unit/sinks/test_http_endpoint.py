"""The agent's and the fleet's HTTP endpoint over a real socket: ``/`` is a landing page linking to
every route (as node_exporter's), ``/metrics`` and the routes answer, anything else is a 404."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from otel_dra import __version__
from otel_dra.classifier import Verdict
from otel_dra.sinks import exposition
from otel_dra.sinks.endpoint import DEFAULT_DESCRIPTION, HttpEndpoint, Route
from otel_dra.sinks.exposition import ExpositionCache
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import pcie_group


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def devices() -> tuple[str, str, bytes]:
    return "200 OK", "application/json", b'{"devices": []}'


def healthz() -> tuple[str, str, bytes]:
    return "200 OK", "text/plain", b"ok\n"


ROUTES: dict[str, Route] = {"/healthz": healthz, "/v1/devices": devices}


def serve(routes: dict[str, Route], description: str = DEFAULT_DESCRIPTION) -> HttpEndpoint:
    cache = ExpositionCache(CollectorRegistry(), 60.0)
    cache.render()
    endpoint = HttpEndpoint("127.0.0.1", 0, cache, routes, description=description)
    endpoint.start()
    return endpoint


@pytest.fixture
def agent_endpoint() -> Iterator[str]:
    endpoint = serve(ROUTES, description="otel-dra node agent on node n7 <&>")
    yield f"http://127.0.0.1:{endpoint.port}"
    endpoint.shutdown()


def test_the_landing_page_names_the_program_says_what_this_is_and_links_to_every_route(agent_endpoint):
    code, content_type, page = get(agent_endpoint + "/")
    assert code == 200 and content_type.startswith("text/html")
    assert f"<title>otel-dra {__version__}</title>" in page
    assert "otel-dra node agent on node n7 &lt;&amp;&gt;" in page  # escaped, not markup
    links = re.findall(r'href="([^"]+)"', page)
    assert links == ["metrics", "healthz", "v1/devices"]  # relative: it works behind a path prefix too
    for link in links:  # each one followed from the page answers
        assert get(f"{agent_endpoint}/{link}")[0] == 200, link


def test_a_query_string_still_gets_the_landing_page(agent_endpoint):
    code, _, page = get(agent_endpoint + "/?from=browser")
    assert code == 200 and 'href="metrics"' in page


@pytest.mark.parametrize("path", ["/index.html", "/metricsx", "/v1", "//"])
def test_anywhere_else_is_still_a_404_naming_the_routes(agent_endpoint, path):
    code, content_type, body = get(agent_endpoint + path)
    assert code == 404 and content_type.startswith("text/plain")
    assert "/metrics" in body and "/v1/devices" in body


def test_without_a_description_the_page_says_what_otel_dra_is():
    endpoint = serve(ROUTES)
    try:
        code, _, page = get(f"http://127.0.0.1:{endpoint.port}/")
    finally:
        endpoint.shutdown()
    assert code == 200 and f"<p>{DEFAULT_DESCRIPTION}</p>" in page


def test_a_route_for_the_root_replaces_the_landing_page():
    def root() -> tuple[str, str, bytes]:
        return "200 OK", "text/plain", b"mine\n"

    endpoint = serve({"/": root, **ROUTES})
    try:
        assert get(f"http://127.0.0.1:{endpoint.port}/")[2] == "mine\n"
    finally:
        endpoint.shutdown()


def test_a_large_rendering_is_kept_compressed_and_served_to_either_kind_of_scraper(monkeypatch):
    """Past PLAIN_MAX_BYTES (a fleet's 600,000 series) only the gzip of a rendering is kept: Prometheus gets
    it as it is, a scraper that takes no gzip gets the same text decompressed."""
    monkeypatch.setattr(exposition, "PLAIN_MAX_BYTES", 100)
    text = b"".join(b'hw_status{hw_id="gpu-%d"} 1\n' % i for i in range(1000))
    cache = ExpositionCache(
        CollectorRegistry(), 60.0, extra=lambda: (text[i : i + 999] for i in range(0, len(text), 999))
    )
    cache.render()  # (the text in pieces, compressed as they come)
    assert cache._body is None and cache._gzipped is not None and len(cache._gzipped) < len(text) / 5
    assert gzip.decompress(cache.body(True) or b"").endswith(text)
    assert (cache.body(False) or b"").endswith(text)
    endpoint = HttpEndpoint("127.0.0.1", 0, cache, ROUTES)
    endpoint.start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        plain = urllib.request.Request(url, headers={"Accept-Encoding": "identity"})
        with urllib.request.urlopen(plain, timeout=5) as resp:
            assert resp.headers.get("Content-Encoding") is None and resp.read().endswith(text)
        zipped = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(zipped, timeout=5) as resp:
            assert resp.headers.get("Content-Encoding") == "gzip" and gzip.decompress(resp.read()).endswith(text)
    finally:
        endpoint.shutdown()


@pytest.mark.parametrize("plain_max", [100, 8 << 20], ids=["large, gzip only", "small, text"])
def test_the_verdict_text_is_rendered_again_only_when_its_version_moves(monkeypatch, plain_max):
    """A fleet's verdict text changes only with its board: while ``extra_version`` stays, a rendering reuses it
    (compressed as it was: a gzip member of its own after the registry's) and only the registry's series,
    which move with every tick, are rendered again."""
    monkeypatch.setattr(exposition, "PLAIN_MAX_BYTES", plain_max)
    registry = CollectorRegistry()
    ticks = Counter("fleet_ticks", "ticks so far", registry=registry)
    version, made = [1], []

    def extra() -> Iterator[bytes]:
        made.append(version[0])
        return iter([b'hw_status{hw_id="gpu-%d",v="%d"} 1\n' % (i, version[0]) for i in range(200)])

    cache = ExpositionCache(registry, 60.0, extra=extra, extra_version=lambda: version[0])
    for _ in range(3):
        ticks.inc()
        cache.render()
    text = (cache.body(False) or b"").decode()
    assert made == [1] and "fleet_ticks_total 3.0" in text and text.count('v="1"') == 200
    assert gzip.decompress(cache.body(True) or b"").decode() == text  # (two gzip members read as one stream)
    version[0] = 2
    cache.render()
    text = (cache.body(False) or b"").decode()
    assert made == [1, 2] and text.count('v="2"') == 200 and 'v="1"' not in text


def test_a_small_rendering_in_pieces_is_kept_as_text():
    cache = ExpositionCache(CollectorRegistry(), 60.0, extra=lambda: iter([b"a 1\n", b"b 2\n"]))
    cache.render()
    assert cache._gzipped is None and (cache.body(False) or b"").endswith(b"a 1\nb 2\n")
    assert gzip.decompress(cache.body(True) or b"").endswith(b"a 1\nb 2\n")


def link_verdict(node: str, i: int, group: str | None) -> Verdict:
    """gpu-<i> of ``node``: in the link finding ``group`` (a PCIe switch's), or Healthy on its own."""
    if group is None:
        return Verdict(1, node, f"gpu-{i}", "Healthy", "ok", (), "none", "fine", pool=node, device=f"gpu-{i}")
    return Verdict(
        1,
        node,
        f"gpu-{i}",
        "Unhealthy",
        "failed",
        ("link",),
        "reboot_node",
        "link: PCIe replay errors on every GPU behind the switch",
        pool=node,
        device=f"gpu-{i}",
        scope="link",
        group=group,
    )


def test_v1_devices_carries_a_link_findings_scope_and_group_on_each_of_its_devices_and_status_lists_it_once():
    """The board's ``/v1/devices`` over a real socket: the 4 GPUs behind one PCIe switch each say ``scope`` link and
    the switch's group; the others say device and no group. ``otel-dra status --by group`` reads it as one finding."""
    switch = pcie_group("0000:40:00.0")
    board = VerdictBoard()
    board.update([link_verdict("train-007", i, switch if i < 4 else None) for i in range(8)], lambda node, dev: {})
    endpoint = serve({"/v1/devices": board.json_route})
    try:
        url = f"http://127.0.0.1:{endpoint.port}"
        code, content_type, body = get(url + "/v1/devices")
        assert code == 200 and content_type == "application/json"
        devices = {d["hw.id"]: d for d in json.loads(body)["devices"]}
        assert {h: (d["scope"], d.get("group")) for h, d in devices.items()} == {
            **{f"gpu-{i}": ("link", "pcie/0000:40:00.0") for i in range(4)},
            **{f"gpu-{i}": ("device", None) for i in range(4, 8)},
        }
        shown = subprocess.run(
            [sys.executable, "-m", "otel_dra", "status", url, "--by", "group"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        )
    finally:
        endpoint.shutdown()
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith("link ")]
    assert rows == [["link", "pcie/0000:40:00.0", "train-007", "4", "Unhealthy", "failed", "link", "reboot_node"]]


def test_nobody_scraping_nothing_is_rendered_and_the_next_scrape_renders_what_landed(monkeypatch):
    """Rendering after every sample for nobody cost a real fleet a quarter of its CPU (bench_fleet_process): with
    no scrape within WANTED_S, samples only mark the rendering stale; the next scrape renders them first, and
    while scrapes keep coming the renderer renders a costly rendering as samples land again, so a scrape is a copy."""
    from prometheus_client import Gauge

    from otel_dra.sinks import exposition
    from otel_dra.sinks.exposition import Renderer

    monkeypatch.setattr(exposition, "ON_SCRAPE_S", 0.0)  # (every rendering counts as costly here)
    registry = CollectorRegistry()
    gauge = Gauge("otel_dra_test_value", "a value", registry=registry)
    cache = ExpositionCache(registry, 3600.0)
    renderer = Renderer(cache)
    renderer.start()  # (one rendering: the first scrape finds data)
    try:
        assert cache.renders == 1
        for v in range(5):  # samples land, nobody scrapes
            gauge.set(v)
            renderer.sampled()
            time.sleep(0.05)
        assert cache.renders == 1 and not cache.ready()
        assert b"otel_dra_test_value 4.0" in cache.body(False)  # the scrape renders what landed
        assert cache.renders == 2 and cache.ready()
        gauge.set(7)
        renderer.sampled()  # scraped just now: rendered as it lands, on the renderer's thread
        deadline = time.monotonic() + 5
        while cache.renders < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.renders == 3 and cache.ready() and b"otel_dra_test_value 7.0" in cache.body(False)
        assert cache.renders == 3  # (a scrape of a fresh rendering renders nothing)
    finally:
        renderer.shutdown()


def test_a_quick_rendering_is_made_by_the_scrape_not_after_every_sample():
    """An agent samples every second and renders its few hundred series in some 20 ms: scraped every 15 s, a
    rendering after each sample is fourteen nobody reads (most of its CPU, bench_agent). Scraped or not, its samples
    only mark the rendering stale, and each scrape renders once what landed."""
    from prometheus_client import Gauge

    from otel_dra.sinks.exposition import Renderer

    registry = CollectorRegistry()
    gauge = Gauge("otel_dra_test_value", "a value", registry=registry)
    cache = ExpositionCache(registry, 3600.0)
    renderer = Renderer(cache)
    renderer.start()
    try:
        for scrape in range(3):
            for v in range(4):
                gauge.set(10 * scrape + v)
                renderer.sampled()
                time.sleep(0.05)
            assert cache.renders == 1 + scrape and not cache.ready()
            assert f"otel_dra_test_value {10 * scrape + 3}.0".encode() in cache.body(False)
            assert cache.renders == 2 + scrape and cache.ready()
    finally:
        renderer.shutdown()


def test_a_fleet_whose_verdict_text_is_costly_renders_ahead_even_while_the_board_stands(monkeypatch):
    """A fleet's verdict text (0.65 s at 100,000 devices) is kept while the board stands, so most renderings are
    the quick self-telemetry alone; what decides whether to render ahead of the scrapes is what a rendering costs
    when the verdicts move, or a scrape after a tick that changed them would wait for it."""
    from otel_dra.sinks import exposition

    monkeypatch.setattr(exposition, "ON_SCRAPE_S", 0.2)
    version = [1]

    def slow_text() -> bytes:
        time.sleep(0.25)
        return b"otel_dra_verdict 1\n"

    cache = ExpositionCache(CollectorRegistry(), 3600.0, extra=slow_text, extra_version=lambda: version[0])
    cache.body(False)  # a scrape: wanted from now on
    cache.render()  # the verdict text rendered anew (slow)
    assert cache.wanted()
    cache.render()  # the board stood: the registry's text alone, quick
    assert cache.render_seconds < 0.2 and cache.wanted()


def test_a_rendering_its_maker_compressed_is_kept_as_it_is_and_served_to_either_kind_of_scraper():
    """A fleet's verdict text made on two cores comes gzip-compressed already (``Gzipped``, several members): the
    cache keeps it after the registry's own member, not compressed again, and a scraper without gzip gets the text."""
    text = b"".join(b'hw_status{hw_id="gpu-%d"} 1\n' % i for i in range(1000))
    members = exposition.Gzipped([gzip.compress(text[:5000]), gzip.compress(text[5000:])])
    registry = CollectorRegistry()
    Counter("fleet_ticks", "ticks so far", registry=registry).inc()
    cache = ExpositionCache(registry, 60.0, extra=lambda: members, extra_version=lambda: 1)
    cache.render()
    assert cache._body is None and cache._gzipped is not None and cache._gzipped.endswith(bytes(members))
    plain = (cache.body(False) or b"").decode()
    assert plain.endswith(text.decode()) and "fleet_ticks_total 1.0" in plain
    assert gzip.decompress(cache.body(True) or b"").decode() == plain


def test_idle_waits_for_a_rendering_in_progress_and_says_whether_none_runs():
    """What a fleet's tick waits on before it starts (``Fleet.run``): a rendering running holds it, bounded."""
    entered, release = threading.Event(), threading.Event()

    def extra() -> bytes:
        entered.set()
        release.wait(10)
        return b"a 1\n"

    cache = ExpositionCache(CollectorRegistry(), 60.0, extra=extra)
    assert cache.idle(0.0)  # nothing rendering
    renderer = threading.Thread(target=cache.render)
    renderer.start()
    try:
        assert entered.wait(5)
        assert not cache.idle(0.05)  # still rendering after the bound: the caller goes on
        release.set()
        assert cache.idle(5)
    finally:
        release.set()
        renderer.join(5)
    assert (cache.body(False) or b"").endswith(b"a 1\n")
