"""No import circle anywhere in ``failsoft``: the package's module graph is acyclic.

The graph is built statically by grimp (import-linter's engine) from every ``import`` and
``from ... import`` in the package's source, wherever it stands:

* at module level;
* inside functions: a circle hidden in a function still ties its modules together (neither can be
  read, tested or moved without the other) and still runs, only later;
* under ``if TYPE_CHECKING:``: these count too. A module that names another's types depends on it
  for every reader and for the type checker; a circle through type-only imports is how classes
  spread over several modules (mixins typed ``self: Other``) and "back references" to a caller hide
  theirs. Breaking one is no harder than breaking any other: move the shared type down a layer, or
  describe what is needed with a ``Protocol`` where it is used.

A package's ``__init__`` is a module like any other: what it re-exports are its edges. The implicit
edge from a module to its parent package (importing ``a.b`` runs ``a/__init__``) is not added: with
it, every ``__init__`` that re-exports a submodule would close a circle.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import grimp
import networkx as nx
import pytest


def _grimp_graph(package: str) -> grimp.ImportGraph:
    return grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=False)


def import_graph(package: str, graph: grimp.ImportGraph | None = None) -> nx.DiGraph:
    """Module -> the modules of ``package`` it imports, anywhere in its source (see the docstring)."""
    graph = graph or _grimp_graph(package)
    edges = nx.DiGraph()
    edges.add_nodes_from(graph.modules)
    for module in graph.modules:
        edges.add_edges_from((module, target) for target in graph.find_modules_directly_imported_by(module))
    return edges


def import_circles(package: str) -> list[str]:
    """One description per group of modules of ``package`` that import one another: a cycle through
    the group with the lines that import, then every module in it; empty when there is none."""
    graph = _grimp_graph(package)
    edges = import_graph(package, graph)
    found = []
    for component in sorted(nx.strongly_connected_components(edges), key=min):
        start = min(component)
        if len(component) == 1 and not edges.has_edge(start, start):
            continue
        cycle = [a for a, _ in nx.find_cycle(edges.subgraph(component), source=start)]
        lines = []
        for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
            details = graph.get_import_details(importer=a, imported=b)
            where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
            lines.append(f"    {a} -> {b} ({where})")
        head = " -> ".join([*cycle, cycle[0]])
        found.append("\n".join([head, *lines, f"    (all in the circle: {sorted(component)})"]))
    return found


def test_the_whole_package_has_no_import_circle():
    circles = import_circles("failsoft")
    assert not circles, "import circles in failsoft:\n" + "\n".join(circles)


def test_the_graph_is_the_whole_package():
    """An empty or partial graph would pass the check above: it holds every module and a package's
    re-exports (imports inside functions and under TYPE_CHECKING: the small packages below)."""
    edges = import_graph("failsoft")
    assert len(edges) > 150 and {"failsoft.cli", "failsoft.runtime.gateway.app"} <= set(edges)
    assert edges.has_edge("failsoft.orchestration", "failsoft.orchestration.core")  # __init__ re-export


@pytest.mark.parametrize("hidden", ["function", "type_checking"])
def test_a_hidden_circle_is_found_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: str):
    package = tmp_path / f"circled_{hidden}"
    package.mkdir()
    (package / "__init__.py").write_text(f"from {package.name}.a import A\n")
    (package / "a.py").write_text(f"from {package.name}.b import B\n\nclass A(B): ...\n")
    back = {  # b imports a back, out of sight of a plain module-level scan
        "function": f"""
            def make():
                from {package.name}.a import A
                return A()
            """,
        "type_checking": f"""
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from {package.name}.a import A
            """,
    }[hidden]
    (package / "b.py").write_text(textwrap.dedent(back) + "\nclass B: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_graph(package.name).has_edge(package.name, f"{package.name}.a")  # __init__ re-export
    [circle] = import_circles(package.name)
    assert circle.startswith(f"{package.name}.a -> {package.name}.b -> {package.name}.a\n"), circle
    assert f"{package.name}.b -> {package.name}.a (line " in circle, circle


def test_no_policy_imports_the_registry_back():
    """The registry picks policies by name; a policy that imported it would tie every policy to all."""
    importers = _grimp_graph("failsoft").find_modules_that_directly_import("failsoft.policies.registry")
    assert not {m for m in importers if m.startswith("failsoft.policies.")}, importers
