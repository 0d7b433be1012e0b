"""State shared between the pipeline's stages, each written by one and read by others.

- :class:`FrameStore`: the newest frame per agent, for the metric sinks.
- :class:`VerdictBoard`: every device's current verdict, for every verdict sink.
"""

from otel_dra.state.board import VerdictBoard
from otel_dra.state.latest import FrameStore

__all__ = ["FrameStore", "VerdictBoard"]
