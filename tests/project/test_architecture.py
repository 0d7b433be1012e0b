"""The package layout is the architecture: no import cycle between packages, and no import upward.

Every ``import otel_dra...`` in every module counts, including the lazy ones inside functions and
the ``TYPE_CHECKING`` ones: a type-only upward import is still a dependency a maintainer meets.
``LAYERS`` lists them low to high; a unit may import its own layer or lower.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "otel_dra"
LAYERS: list[set[str]] = [
    {"__init__", "vocabulary", "conventions", "frame", "faults", "logs", "component", "words"},  # foundations
    {"policy", "policies"},  # the policy: data (the default YAML), validated
    {"sources", "decode", "classifier", "scenario", "serve"},  # samples in, verdicts out; serving HTTP
    {"state"},  # shared between stages: the board, the newest frames
    {"receivers", "sinks"},  # the pipeline's edges
    {"config"},  # the agent's and the fleet's configs, made of the components'
    {"agent", "fleet", "replay", "replay_plot"},  # pipelines (and the picture of a replay)
    {"cli", "__main__"},  # the commands
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
GENERATED = ("sinks/kubelet/api/",)


def unit_of(module: str) -> str:
    """``otel_dra.sinks.k8s.render`` → ``sinks``; ``otel_dra`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[str, set[tuple[str, str]]]:
    """unit → {(imported unit, importing file)} for every import between different units."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(GENERATED):
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        source = unit_of(module)
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "otel_dra":
                    targets = ["__init__" if a.name == "__version__" else a.name for a in node.names]
                elif node.module.startswith("otel_dra."):
                    targets = [unit_of(node.module)]
            elif isinstance(node, ast.Import):
                targets = [unit_of(a.name) for a in node.names if a.name.startswith("otel_dra.")]
            edges[source].update((t, rel) for t in targets if t != source)
    return edges


def test_every_unit_has_a_layer():
    units = {unit_of(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in PACKAGE.glob("*.py")}
    units |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert units - set(RANK) == set(), "give the new package a layer in LAYERS"


def test_no_module_imports_upward():
    upward = sorted(
        f"{where} ({source}, layer {RANK[source]}) imports {target} (layer {RANK[target]})"
        for source, targets in imports().items()
        for target, where in targets
        if RANK[target] > RANK[source]
    )
    assert upward == []


def test_no_import_cycle_between_packages():
    graph = {source: {t for t, _ in targets} for source, targets in imports().items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(unit: str, path: list[str]) -> list[str] | None:
        state[unit] = 1
        for nxt in sorted(graph.get(unit, ())):
            if state.get(nxt) == 1:
                return [*path, unit, nxt]
            if nxt not in state and (found := visit(nxt, [*path, unit])):
                return found
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in state and (cycle := visit(unit, [])):
            pytest.fail("import cycle: " + " -> ".join(cycle[cycle.index(cycle[-1]) :]))


def test_the_checks_catch_what_they_are_for(tmp_path):
    """An upward import and a cycle, planted in a copy of the layout, are both found."""
    fake = tmp_path / "otel_dra"
    (fake / "policy").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "policy" / "__init__.py").write_text("from otel_dra.sinks import x\n")
    (fake / "sinks").mkdir()
    (fake / "sinks" / "__init__.py").write_text("from otel_dra.policy import y\n")
    globals()["PACKAGE"] = fake
    try:
        with pytest.raises(AssertionError):
            test_no_module_imports_upward()
        with pytest.raises(
            pytest.fail.Exception, match=r"import cycle: (policy -> sinks -> policy|sinks -> policy -> sinks)"
        ):
            test_no_import_cycle_between_packages()
    finally:
        globals()["PACKAGE"] = Path(__file__).resolve().parents[2] / "otel_dra"
