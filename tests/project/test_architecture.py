"""The package layout is the architecture: no import cycle between packages, and no import upward.

Every ``import otel_dra...`` in every module counts, including the lazy ones inside functions and
the ``TYPE_CHECKING`` ones: a type-only upward import is still a dependency a maintainer meets. So
does every import made by name at run time (``importlib.import_module``, ``__import__``,
``importlib.util.find_spec``): its target must be a constant ``"otel_dra..."`` string, or start with
``__name__`` or a constant ``"otel_dra.<unit>."`` prefix; one the test cannot resolve fails it.
``LAYERS`` lists them low to high; a unit may import its own layer or lower.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "otel_dra"
BY_NAME = ("import_module", "__import__", "find_spec")
LAYERS: list[set[str]] = [
    # foundations
    {
        "__init__",
        "vocabulary",
        "conventions",
        "frame",
        "faults",
        "logs",
        "component",
        "words",
        "inflate",
        "heap",
        "forked",
    },
    {"policy"},  # the policy: data (the default YAML), validated
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


def by_name(call: ast.Call, module: str) -> str | None:
    """The module an import by name loads, as far as it names one (``""``: not ``otel_dra``'s);
    None when it cannot be told from the source."""
    if not call.args:
        return None
    arg = call.args[0]
    parts: list[ast.expr] = list(arg.values) if isinstance(arg, ast.JoinedStr) else [arg]
    while isinstance(parts[0], ast.BinOp) and isinstance(parts[0].op, ast.Add):
        parts[:1] = [parts[0].left, parts[0].right]
    head = parts[0]
    if isinstance(head, ast.FormattedValue):
        head = head.value
    if isinstance(head, ast.Name) and head.id == "__name__":
        return module  # below the importing module: its own unit
    if not (isinstance(head, ast.Constant) and isinstance(head.value, str)):
        return None
    text = head.value
    if text != "otel_dra" and not text.startswith("otel_dra."):
        return "" if len(parts) == 1 and not text.startswith(".") else None
    if len(parts) == 1:
        return text
    prefix = text.split(".")
    return ".".join(prefix[:2]) if len(prefix) > 2 else None  # "otel_dra.<unit>." and more: the unit is known


def is_by_name(node: ast.AST) -> bool:
    """A call of an import-by-name function: ``importlib.import_module(...)``, ``__import__(...)``, ..."""
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr in BY_NAME)
        or (isinstance(node.func, ast.Name) and node.func.id in BY_NAME)
    )


def modules() -> list[tuple[str, str, ast.AST]]:
    """(relative path, module name, syntax tree) for every module of the package but the generated ones."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(GENERATED):
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        out.append((rel, module, ast.parse(path.read_text(), rel)))
    return out


def imports() -> dict[str, set[tuple[str, str]]]:
    """unit → {(imported unit, importing file)} for every import between different units."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for rel, module, tree in modules():
        source = unit_of(module)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "otel_dra":
                    targets = ["__init__" if a.name == "__version__" else a.name for a in node.names]
                elif node.module.startswith("otel_dra."):
                    targets = [unit_of(node.module)]
            elif isinstance(node, ast.Import):
                targets = [unit_of(a.name) for a in node.names if a.name.startswith("otel_dra.")]
            elif isinstance(node, ast.Call) and is_by_name(node) and (named := by_name(node, module)):
                targets = [unit_of(named)]
            edges[source].update((t, rel) for t in targets if t != source)
    return edges


def unresolved() -> list[str]:
    """Every import by name whose module cannot be told from the source, as ``FILE:LINE: call``."""
    return sorted(
        f"{rel}:{node.lineno}: {ast.unparse(node)}"
        for rel, module, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and is_by_name(node) and by_name(node, module) is None
    )


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


def test_every_import_by_name_can_be_followed():
    """An import by name this test cannot resolve is an edge it cannot check: name the module with a
    constant "otel_dra..." string (or __name__), or import it plainly."""
    assert unresolved() == [], "imports by name this test cannot resolve to a module (see the docstring)"


def test_the_checks_catch_what_they_are_for(tmp_path):
    """An upward import and a cycle, planted in a copy of the layout, are both found; so are an upward
    import made by name at run time and one whose module cannot be told (:func:`plant_by_name`)."""
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
    plant_by_name(tmp_path / "by_name")


def plant_by_name(root: Path) -> None:
    """An upward import made by name at run time, planted in a copy of the layout, is found; and one
    whose module cannot be told from the source fails the test that says so."""
    fake = root / "otel_dra"
    for unit in ("policy", "sinks", "sources"):
        (fake / unit).mkdir(parents=True)
        (fake / unit / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "policy" / "owners.py").write_text(
        'import importlib\n\ndef owner():\n    return importlib.import_module("otel_dra.sinks.k8s.settings")\n'
    )
    (fake / "sources" / "table.py").write_text(
        'import importlib\n\nNAMES = {"a": "otel_dra.sources.a"}\nimportlib.import_module(NAMES["a"])\n'
        'importlib.import_module(f"{__name__}.a")\n'
    )
    globals()["PACKAGE"] = fake
    try:
        with pytest.raises(AssertionError, match=r"policy/owners.py \(policy, layer 1\) imports sinks"):
            test_no_module_imports_upward()
        assert unresolved() == ["sources/table.py:4: importlib.import_module(NAMES['a'])"]
        with pytest.raises(AssertionError, match="cannot resolve"):
            test_every_import_by_name_can_be_followed()
    finally:
        globals()["PACKAGE"] = Path(__file__).resolve().parents[2] / "otel_dra"
