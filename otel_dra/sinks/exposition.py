"""Sink: the Prometheus exposition, rendered once per sample instead of once per scrape, and only while scraped.

Values only change when a sample lands, but rendering the OpenTelemetry SDK's
Prometheus reader costs tens of microseconds per series (1.6 s for 42,000 series,
see BENCHMARKS.md), on every scrape, for every scraper. Rendering once per sample
on a background thread and serving the bytes makes a scrape cost a memory copy,
whatever the fleet size and however many Prometheus replicas scrape: the scrape
timeouts dcgm-exporter users report at scale don't happen here.

Nobody scraping, nothing is rendered: the background rendering runs while a scrape came within
:data:`WANTED_S` (a Prometheus scraping every minute keeps it going); past that a sample only marks the
rendering stale, and the next scrape renders it first (measured on a real fleet, rendering after every
tick for nobody took a quarter of its CPU: BENCHMARKS.md, bench_fleet_process). A small rendering (an
agent's few hundred series: some 20 ms) is always left to the scrape that wants it: sampling every second
and scraped every 15 s, rendering each sample would be fourteen renderings nobody reads (most of an agent's
CPU, bench_agent), and the scrape waits for one of under :data:`ON_SCRAPE_S`.

A large rendering (a fleet's: 600,000 series at 100,000 devices, some 200 MB of text) is kept
gzip-compressed only, compressed once on the rendering thread: Prometheus takes gzip, and the text
is mostly label strings that repeat, about a twentieth of its size compressed (the fleet's verdict text comes
compressed already: :class:`Gzipped`). A scraper that does not take gzip gets it decompressed, a copy per such
scrape.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from zlib_ng import zlib_ng

log = logging.getLogger(__name__)

#: A rendering over this size is kept gzip-compressed only (an agent's few thousand series stay as text too).
PLAIN_MAX_BYTES: Final = 8 << 20
#: How long after the last scrape samples are still rendered as they land (Prometheus scrapes every 15 s to 1 min;
#: one that scrapes less often than this finds a stale rendering and waits for one).
WANTED_S: Final = 300.0
#: A rendering that took less than this is made by the scrape that asks for it, not after every sample.
ON_SCRAPE_S: Final = 0.1


class Gzipped:
    """Exposition text gzip-compressed already, as gzip members in order: an ``extra`` that returns it is kept as
    it is (:class:`ExpositionCache`), its members shared with their maker, not joined into a copy of their own."""

    __slots__ = ("members",)

    def __init__(self, members: Iterable[bytes]) -> None:
        self.members = tuple(members)

    def __bytes__(self) -> bytes:
        return b"".join(self.members)


def _packer() -> zlib_ng._Compress:
    """A gzip stream at level 1, by zlib-ng: ~3x zlib's speed on exposition text (a fleet's 300 MB of it), a
    fifth larger compressed."""
    return zlib_ng.compressobj(1, zlib_ng.DEFLATED, 31)


#: What an ``extra`` rendering is: text whole or in pieces, or gzip members already.
Extra = bytes | Iterable[bytes] | Gzipped


def gzip_member(data: bytes) -> bytes:
    """``data`` as one gzip member, level 1 (:func:`_packer`)."""
    packer = _packer()
    return packer.compress(data) + packer.flush()


class ExpositionCache:
    """The registry's newest rendering, and ``extra``'s (kept while its version stands); :meth:`render` replaces
    the body whole."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        registry: CollectorRegistry,
        max_age_s: float,
        extra: Callable[[], Extra] | None = None,
        extra_version: Callable[[], int] | None = None,
    ) -> None:
        """``extra``: more exposition text appended to the registry's (the fleet's verdicts), whole or in pieces
        (a large one is compressed as its pieces come, never held whole), or :class:`Gzipped` already.
        ``extra_version``: a number that moves whenever ``extra``'s text would (the board's version): while it
        stays, the last rendering of ``extra`` is reused, compressed as it was, and only the registry's text is
        rendered again."""
        self._registry = registry
        self._extra = extra
        self._extra_version = extra_version
        self._extra_seen: int | None = None  # the version the kept rendering of extra shows
        self._extra_plain: list[bytes] = []  # extra's text, when small
        self._extra_gz: tuple[bytes, ...] | None = None  # extra's text as gzip members, when large
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._rendering = threading.Lock()  # one rendering at a time (the renderer's, or a scrape's)
        self._body: bytes | None = None
        self._gzipped: bytes | None = None
        self._rendered_at = 0.0
        self._stale = False  # a sample landed that no rendering shows yet
        self.asked_at = -float("inf")  # when a scrape last asked (monotonic)
        self.render_seconds = 0.0
        self.renders = 0
        self._head_seconds = 0.0  # the registry's text, the last rendering
        self._extra_seconds = 0.0  # extra's text, the last time it was rendered anew

    def stale(self) -> None:
        """A sample landed and nobody is rendering it: the next scrape renders first."""
        self._stale = True

    def wanted(self, within_s: float = WANTED_S) -> bool:
        """Whether rendering as samples land is worth it: a scrape came within ``within_s``, and the last
        rendering took long enough, extra's text counted as the last time it changed (:data:`ON_SCRAPE_S`), that a
        scrape should not wait for it."""
        costly = self._head_seconds + self._extra_seconds >= ON_SCRAPE_S
        return costly and time.monotonic() - self.asked_at <= within_s

    def render(self) -> None:
        """Collect every instrument and render the text exposition (past :data:`PLAIN_MAX_BYTES`, gzip
        only)."""
        with self._rendering:
            self._stale = False
            self._render()

    def idle(self, timeout_s: float) -> bool:
        """Wait until no rendering runs, ``timeout_s`` at most; whether none does. A fleet's tick waits so before
        it starts: a rendering a scrape is waiting for (a fleet's first, on both cores) took half as long again
        with ticks holding the interpreter beside it (100,000 devices in process: 0.30 s alone, 0.43-0.47 s)."""
        if not self._rendering.acquire(timeout=timeout_s):
            return False
        self._rendering.release()
        return True

    def _render(self) -> None:
        t0 = time.perf_counter()
        head = generate_latest(self._registry)
        t1 = time.perf_counter()
        if self._render_extra():
            self._extra_seconds = time.perf_counter() - t1
        self._head_seconds = t1 - t0
        body: bytes | None = None
        gzipped: bytes | None = None
        if self._extra_gz is not None:  # large: gzip only, the registry's text as a member of its own before it
            gzipped = b"".join((gzip_member(head), *self._extra_gz))
        else:
            joined = head + b"".join(self._extra_plain) if self._extra_plain else head
            if len(joined) > PLAIN_MAX_BYTES:
                gzipped = gzip_member(joined)
            else:
                body = joined
        with self._lock:
            self._body, self._gzipped = body, gzipped
            self._rendered_at = time.monotonic()
        self.render_seconds = time.perf_counter() - t0
        self.renders += 1

    def _render_extra(self) -> bool:
        """``extra``'s text, kept while its version stays: as pieces when small, else as one gzip member
        (compressed as its pieces come, never held whole; members one after another are one gzip stream,
        RFC 1952 section 2.2, which Prometheus and every gzip reader take). Whether it was rendered anew."""
        if self._extra is None:
            return False
        version = self._extra_version() if self._extra_version is not None else None
        if version is not None and version == self._extra_seen:
            return False
        extra = self._extra()
        if isinstance(extra, Gzipped):  # compressed by its maker (on two cores: verdict_text)
            self._extra_plain, self._extra_gz, self._extra_seen = [], extra.members, version
            return True
        parts: list[bytes] = []
        size = 0
        packer = None
        packed: list[bytes] = []
        for part in [extra] if isinstance(extra, bytes) else extra:
            size += len(part)
            if packer is not None:
                packed.append(packer.compress(part))
                continue
            parts.append(part)
            if size > PLAIN_MAX_BYTES:  # large: compressed from here on (gzip framing, level 1)
                packer = _packer()
                packed = [packer.compress(p) for p in parts]
                parts = []
        if packer is not None:
            packed.append(packer.flush())
            self._extra_plain, self._extra_gz = [], (b"".join(packed),)
        else:
            self._extra_plain, self._extra_gz = parts, None
        self._extra_seen = version
        return True

    def ready(self) -> bool:
        """Whether :meth:`body` would serve a rendering as it is (no rendering first, no decompression): what
        may be answered on the server's event loop."""
        rendered = self._body is not None or self._gzipped is not None
        return not rendered or not (self._stale or time.monotonic() - self._rendered_at > self._max_age_s)

    def body(self, accept_gzip: bool) -> bytes | None:
        """The newest rendering (gzip-compressed once per rendering when asked, or kept so when large), or None
        before the first.

        A rendering older than ``max_age_s`` means sampling has stopped: render again
        now, so the scrape shows the hw.* series gone rather than frozen values. One that samples
        have landed since, unrendered (nobody was scraping), is rendered now too."""
        self.asked_at = time.monotonic()
        rendered = self._body is not None or self._gzipped is not None
        if rendered and (self._stale or time.monotonic() - self._rendered_at > self._max_age_s):
            self.render()
        with self._lock:
            body, gzipped = self._body, self._gzipped
            if body is not None:
                if not accept_gzip:
                    return body
                if gzipped is None:
                    gzipped = self._gzipped = gzip_member(body)
                return gzipped
            if gzipped is None or accept_gzip:  # (None: not rendered yet)
                return gzipped
        return gzip.decompress(gzipped)  # kept compressed only: a copy for a scraper that takes no gzip


class Renderer:
    """Re-renders the cache after each sample, on its own thread, while it is scraped and slow to render
    (:meth:`ExpositionCache.wanted`; else the sample marks it stale); samples that land while a rendering runs are
    coalesced into the next one."""

    def __init__(self, cache: ExpositionCache) -> None:
        self._cache = cache
        self._due = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exposition", daemon=True)

    def start(self) -> None:
        self._cache.render()  # the first scrape finds data
        self._thread.start()

    def sampled(self) -> None:
        """A new sample is in the store."""
        self._due.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._due.wait()
            self._due.clear()
            if self._stop.is_set():
                return
            if not self._cache.wanted():
                self._cache.stale()
                continue
            try:
                self._cache.render()
            except Exception as exc:  # a failed rendering keeps the previous one served
                log.error("rendering /metrics failed; serving the previous rendering", exc_info=exc)

    def shutdown(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        self._due.set()
