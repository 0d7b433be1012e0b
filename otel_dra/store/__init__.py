"""The store between sources and the classifier.

- :class:`FrameStore`: the newest frame per agent, for the metric sinks.
- :class:`DeviceRegistry`: (``k8s.node.name``, ``hw.id``) → row, reused after a TTL.
- :class:`WindowStore`: per device, a ring of the last samples' features with running
  window sums, so a rule reads a window in O(devices) instead of O(devices x samples).
"""

from otel_dra.store.latest import FrameStore
from otel_dra.store.registry import DeviceRegistry
from otel_dra.store.window import WindowStore

__all__ = ["DeviceRegistry", "FrameStore", "WindowStore"]
