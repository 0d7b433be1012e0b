"""Sink: the Prometheus exposition, rendered once per sample instead of once per scrape.

Values only change when a sample lands, but rendering the OpenTelemetry SDK's
Prometheus reader costs tens of microseconds per series (1.6 s for 42,000 series,
see BENCHMARKS.md), on every scrape, for every scraper. Rendering once per sample
on a background thread and serving the bytes makes a scrape cost a memory copy,
whatever the fleet size and however many Prometheus replicas scrape: the scrape
timeouts dcgm-exporter users report at scale don't happen here.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class ExpositionCache:
    """The registry's newest rendering; :meth:`render` replaces it whole."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry, max_age_s: float, extra: Callable[[], bytes] | None = None) -> None:
        """``extra``: more exposition text appended to the registry's (the fleet's verdicts)."""
        self._registry = registry
        self._extra = extra
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._gzipped: bytes | None = None
        self._rendered_at = 0.0
        self.render_seconds = 0.0

    def render(self) -> None:
        """Collect every instrument and render the text exposition."""
        t0 = time.perf_counter()
        body = generate_latest(self._registry)
        if self._extra is not None:
            body += self._extra()
        with self._lock:
            self._body, self._gzipped = body, None
            self._rendered_at = time.monotonic()
        self.render_seconds = time.perf_counter() - t0

    def body(self, accept_gzip: bool) -> bytes | None:
        """The newest rendering (gzip-compressed once per rendering when asked), or None before the first.

        A rendering older than ``max_age_s`` means sampling has stopped: render again
        now, so the scrape shows the hw.* series gone rather than frozen values."""
        if self._body is not None and time.monotonic() - self._rendered_at > self._max_age_s:
            self.render()
        with self._lock:
            body = self._body
            if body is None or not accept_gzip:
                return body
            if self._gzipped is None:
                self._gzipped = gzip.compress(body, compresslevel=1)
            return self._gzipped


class Renderer:
    """Re-renders the cache after each sample, on its own thread; samples that land
    while a rendering runs are coalesced into the next one."""

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
            try:
                self._cache.render()
            except Exception as exc:  # a failed rendering keeps the previous one served
                log.error("rendering /metrics failed; serving the previous rendering", exc_info=exc)

    def shutdown(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        self._due.set()
