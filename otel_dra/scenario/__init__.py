"""Messy-fleet scenarios: a generator of labelled OTLP recordings and a scorer of verdicts.

``generate.generate`` (or :func:`run`) writes a recording (``otel-dra replay`` input) and its
labels; ``score.score`` reads the labels and a replay's verdict lines and says which faults
were caught in time, how many false alarms and spurious Unknowns there were, and
:func:`passes` which targets were missed. The functions ``generate`` and ``score`` live in
the submodules of the same names (import them from there). No classifier is imported.
"""

from __future__ import annotations

from otel_dra.scenario.generate import FORMS, SHAPES, GenerateResult, ScenarioConfig, form, run
from otel_dra.scenario.score import LabelsError, Score, passes, score_files

__all__ = [
    "FORMS",
    "SHAPES",
    "GenerateResult",
    "LabelsError",
    "ScenarioConfig",
    "Score",
    "form",
    "passes",
    "run",
    "score_files",
]
