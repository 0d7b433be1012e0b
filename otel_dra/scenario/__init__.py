"""Messy-fleet scenarios: a generator of labelled OTLP recordings and a scorer of verdicts.

``generate.generate`` (or :func:`run`) writes a recording (``otel-dra replay`` input) and its
labels; ``score.score`` reads the labels and a replay's verdict lines and says which faults
were caught in time, how many false alarms and spurious Unknowns there were, and
:func:`passes` which targets were missed. The functions ``generate`` and ``score`` live in
the submodules of the same names (import them from there). ``load`` is the job model both
simulators share (the simulated source imports it). No classifier is imported.

The names below are imported when first used, so ``otel_dra.scenario.load`` (which the agent and
the command line import) does not bring the generator and the scorer with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_dra.scenario.figures import Score, passes
    from otel_dra.scenario.generate import FORMS, SHAPES, GenerateResult, ScenarioConfig, form, run
    from otel_dra.scenario.score import score_files
    from otel_dra.scenario.score_labels import LabelsError

_HOME = {
    "FORMS": "generate",
    "SHAPES": "generate",
    "GenerateResult": "generate",
    "ScenarioConfig": "generate",
    "form": "generate",
    "run": "generate",
    "LabelsError": "score_labels",
    "Score": "figures",
    "passes": "figures",
    "score_files": "score",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


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
