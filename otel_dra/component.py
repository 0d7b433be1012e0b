"""The component model: every long-lived part of a pipeline starts, and shuts down within a time.

As the OpenTelemetry Collector's components (``Start``/``Shutdown``) and the SDK's exporters
(``shutdown(timeout_millis)``) do. The agent and the fleet are each an ordered list of components
built from their configs: :class:`Components` starts them in order and shuts them down in reverse
within one budget, so a source is closed after every sink that reads from it, the meter provider
flushes after the endpoints stop, and one hung part cannot keep the process from exiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Component(Protocol):
    """A part with a life: ``start`` binds and spawns (and fails there, not later); ``shutdown``
    stops taking work and releases everything within ``timeout_s`` seconds."""

    def start(self) -> None: ...

    def shutdown(self, timeout_s: float) -> None: ...


C = TypeVar("C", bound=Component)


class OnShutdown:
    """A component made of a shutdown callable, for library objects with a lifecycle of their own
    (the SDK's ``MeterProvider``, a source's ``close``): nothing to start."""

    def __init__(self, shutdown: Callable[[float], object]) -> None:
        self._shutdown = shutdown

    def start(self) -> None:
        pass

    def shutdown(self, timeout_s: float) -> None:
        self._shutdown(timeout_s)


class Components:
    """Components in start order; :meth:`shutdown` stops them in reverse, within ``budget_s``."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._started: list[tuple[str, Component]] = []

    def start(self, name: str, component: C) -> C:
        """Start ``component`` now; from here on it is shut down with the rest."""
        component.start()
        self._started.append((name, component))
        return component

    def names(self) -> list[str]:
        return [name for name, _ in self._started]

    def shutdown(self, budget_s: float | None = None) -> list[str]:
        """Shut every started component down, newest first; each gets what is left of the budget (``budget_s``:
        what is left of it, when the caller spent some first) and is abandoned (logged) past it. Returns the
        names of those that did not finish."""
        deadline = time.monotonic() + (self.budget_s if budget_s is None else max(0.0, budget_s))
        late: list[str] = []
        while self._started:
            name, component = self._started.pop()
            left = max(0.0, deadline - time.monotonic())
            done = threading.Thread(target=self._stop_one, args=(name, component, left), daemon=True)
            done.start()
            done.join(left + 0.05)
            if done.is_alive():
                log.warning("%s did not shut down within %.1fs; going on without it", name, self.budget_s)
                late.append(name)
        return late

    @staticmethod
    def _stop_one(name: str, component: Component, timeout_s: float) -> None:
        try:
            component.shutdown(timeout_s)
        except Exception as exc:  # one part failing to stop must not keep the others running
            log.error("%s failed to shut down cleanly", name, exc_info=exc)
