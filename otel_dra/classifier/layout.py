"""What the rules index by: reasons' and scopes' columns, the long horizon's features and spans, and the
states a rule implies, as codes shared by the window reader, the rules and the verdict engine."""

from __future__ import annotations

from otel_dra.classifier.features import F
from otel_dra.vocabulary import REASONS, SCOPES

R = {reason: i for i, reason in enumerate(REASONS)}
OK, PREDICTED, DEGRADED, FAILED = 0, 1, 2, 3
EVENT_FEATURES = (F.RESETS, F.OUT_OF_MEMORY, F.DRIVER_APPLICATION, F.WORKLOAD_APPLICATION, F.WORKLOAD_OOM)
#: Scopes as codes (``otel_dra.vocabulary.SCOPES``): what a reason's evidence is about.
SCOPE = {scope: i for i, scope in enumerate(SCOPES)}
DEVICE, WORKLOAD, NODE = SCOPE["device"], SCOPE["workload"], SCOPE["node"]
LINK, FIRMWARE = SCOPE["link"], SCOPE["firmware"]

#: Features the long horizon keeps (per-minute buckets): low rates and sustained conditions.
HORIZON_FEATURES: tuple[F, ...] = (
    F.DT,
    F.ECC_CORRECTED,
    F.LINK_ERRORS,
    F.THROTTLE_THERMAL,
    F.THROTTLE_POWER,
    F.THROTTLE_BRAKE,
    F.THROTTLE_SLOWDOWN,
    F.UTIL,
    F.BUSY,
    F.TEMP_HOT,
    F.COOLING_BAD,
    F.MEM_FULL,
    F.VOLT_BAD,
    F.WIDTH_DOWN,
    F.GEN_DOWN,
)
H = {f: i for i, f in enumerate(HORIZON_FEATURES)}
#: The horizon's spans, in the order the store keeps them: the duty span, then the rate span.
DUTY_SPAN, RATE_SPAN = 0, 1
