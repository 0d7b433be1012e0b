"""The component model: every long-lived part of a pipeline starts, and shuts down within a time.

As the OpenTelemetry Collector's components (``Start``/``Shutdown``) and the SDK's exporters
(``shutdown(timeout_millis)``) do. The agent and the fleet are each an ordered list of components
built from their configs: :class:`Components` starts them in order and shuts them down in reverse
within one budget, so a source is closed after every sink that reads from it, the meter provider
flushes after the endpoints stop, and one hung part cannot keep the process from exiting. A component's
config is checked once, when it is made: :class:`ConfigError` names the field to fix.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
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
    """Components in start order; :meth:`shutdown` stops them in reverse, within ``budget_s`` (those started
    with ``first_s``, first)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._started: list[tuple[str, Component, float | None]] = []

    def start(self, name: str, component: C, first_s: float | None = None) -> C:
        """Start ``component`` now; from here on it is shut down with the rest. ``first_s``: it is shut down
        before every other, within at most that much of the budget (the state file: a part slow to stop after
        it, a taint write in flight, cannot use up the time of the write that keeps held faults)."""
        component.start()
        self._started.append((name, component, first_s))
        return component

    def names(self) -> list[str]:
        return [name for name, _, _ in self._started]

    def shutdown(self) -> list[str]:
        """Shut every started component down, the ``first_s`` ones first, then newest first; each gets what is
        left of the budget (at most its ``first_s``) and is abandoned (logged) past it. Returns the names of
        those that did not finish."""
        deadline = time.monotonic() + self.budget_s
        order = [c for c in self._started if c[2] is not None] + [c for c in reversed(self._started) if c[2] is None]
        self._started = []
        late: list[str] = []
        for name, component, first_s in order:
            left = max(0.0, deadline - time.monotonic())
            if first_s is not None:
                left = min(left, first_s)
            done = threading.Thread(target=self._stop_one, args=(name, component, left), daemon=True)
            done.start()
            done.join(left + 0.05)
            if done.is_alive():
                within = self.budget_s if first_s is None else first_s
                log.warning("%s did not shut down within %.1fs; going on without it", name, within)
                late.append(name)
        return late

    @staticmethod
    def _stop_one(name: str, component: Component, timeout_s: float) -> None:
        try:
            component.shutdown(timeout_s)
        except Exception as exc:  # one part failing to stop must not keep the others running
            log.error("%s failed to shut down cleanly", name, exc_info=exc)


#: ``{Config.field}`` in a :class:`ConfigError`'s template.
_FIELD = re.compile(r"\{([A-Za-z]\w*)\.([a-z_]\w*)\}")


class ConfigError(ValueError):
    """A configuration value a user must fix, one line that names the config fields it is about.

    The template writes each field as ``{Config.field}`` (``{ReceiverConfig.grpc_port} must be a TCP port``);
    the message names the field (``grpc_port must be a TCP port``), and a front end names it its own way
    (:meth:`named`: the CLI, by its flag), so the configs know nothing of the command line.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.named({}))

    @property
    def fields(self) -> list[str]:
        """The ``Config.field`` names the message is about, in order."""
        return [f"{m[1]}.{m[2]}" for m in _FIELD.finditer(self.template)]

    def named(self, names: Mapping[str, str]) -> str:
        """The message, each field as ``names`` calls it (``Config.field`` → name), else by its own name."""
        return _FIELD.sub(lambda m: names.get(f"{m[1]}.{m[2]}", m[2]), self.template)
