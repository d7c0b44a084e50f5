"""The package's import layering (docs/ARCHITECTURE.md): every `import` of a nopeinterp module,
at the top of a file or inside a function, goes to a module of the same or a lower layer, and
the import graph has no cycle. Walked statically from the source (ast), so a lazy import
inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nopeinterp

ROOT = Path(nopeinterp.__file__).parent

# Lowest first. A module belongs to the layer of its longest listed prefix.
LAYERS = [
    ("foundation", ["nopeinterp", "nopeinterp.errors", "nopeinterp._io", "nopeinterp._memory", "nopeinterp._tl", "nopeinterp._lazy",
                    "nopeinterp.progress", "nopeinterp.hooks", "nopeinterp.results",
                    "nopeinterp.options"]),
    ("tasks", ["nopeinterp.tasks"]),
    ("models", ["nopeinterp.models"]),
    ("data", ["nopeinterp.data"]),
    ("loading", ["nopeinterp.checkpoint", "nopeinterp.zoo"]),
    ("inputs", ["nopeinterp.inputs"]),
    ("computing", ["nopeinterp.evaluation", "nopeinterp.lm_eval", "nopeinterp.probing", "nopeinterp.similarity",
                   "nopeinterp.theory", "nopeinterp.paper", "nopeinterp.training",
                   "nopeinterp.analyses"]),
    ("presenting", ["nopeinterp.viz"]),
    ("report", ["nopeinterp.main_job", "nopeinterp.report", "nopeinterp.demo"]),
    ("entry", ["nopeinterp.cli", "nopeinterp._args", "nopeinterp.__main__"]),
]  # fmt: skip
# What draws may not load or run a model: viz reads results and constants only.
VIZ_NEVER = ("nopeinterp.models", "nopeinterp.checkpoint", "nopeinterp.inputs",
             "nopeinterp.training", "nopeinterp.data", "nopeinterp.zoo")  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the nopeinterp modules it imports (anywhere in the file)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("nopeinterp")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                if not base.startswith("nopeinterp"):
                    continue
                for a in node.names:  # `from pkg import module` imports that module
                    full = f"{base}.{a.name}"
                    targets.add(full if full in mods else base)
        graph[name] = {t for t in targets if t != name and t in mods}
    return graph


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module.startswith(p + ".") and p != "nopeinterp"  # the root: itself only
            if (module == p or inside) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and ARCHITECTURE.md")
    return rank


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (c := visit(t)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_every_module_has_a_layer():
    for m in modules():
        layer_of(m)


def test_no_upward_import():
    graph = import_graph()
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items()
        for t in sorted(targets)
        if layer_of(t) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_viz_loads_and_runs_no_model():
    graph = import_graph()
    bad = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        if m.startswith("nopeinterp.viz")
        for t in targets
        if t.startswith(VIZ_NEVER)
    ]
    assert not bad, "\n".join(bad)
    for m, path in modules().items():
        if m.startswith("nopeinterp.viz"):
            assert "run_with_cache" not in path.read_text(), m


def test_results_name_their_presenter_only_by_string():
    """Results reach viz through `results.PRESENTER` (a module name), never an import."""
    from nopeinterp import results

    assert results.PRESENTER.startswith("nopeinterp.viz.")
    graph = import_graph()
    assert not any(t.startswith("nopeinterp.viz") for t in graph["nopeinterp.results"])


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert find_cycle(graph) == expected


def test_the_walk_sees_lazy_imports():
    """A function-level import counts (base.py once imported its registry lazily)."""
    graph = import_graph()
    assert "nopeinterp.viz.page" in graph["nopeinterp.main_job"]  # imported inside a function
    assert "nopeinterp.models.registry" not in graph["nopeinterp.models.base"]
