"""The classifier: windows of device telemetry in, health verdicts out.

Stages, in the order data flows (each its own module):
``features`` (a batch of raw series → per-sample features, counter increases) →
the window store (``otel_dra.classifier.window``) → ``rules`` (evidence per reason, vectorised) →
``verdicts`` (hysteresis, escalation, health, remediation, change detection).

One node's 8 GPUs or a fleet's 100,000 devices go through the same code: devices are rows
of arrays, and nothing loops over devices except to write the text of a verdict that changed.
:class:`Classifier` (:mod:`otel_dra.classifier.classifier`) runs them; this package's face only names it.
"""

from __future__ import annotations

from otel_dra.classifier.classifier import Classifier
from otel_dra.classifier.freshness import STALL_PERIODS, monotonic_s
from otel_dra.classifier.verdict import Verdict
from otel_dra.classifier.window import window_samples

__all__ = ["STALL_PERIODS", "Classifier", "Verdict", "monotonic_s", "window_samples"]
