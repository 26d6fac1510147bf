"""Policies stay pure: importing them must not pull in Ray, SimPy, FastAPI or torch (DESIGN principle 1)."""

import json
import subprocess
import sys

FORBIDDEN = ["ray", "simpy", "fastapi", "torch", "transformers", "uvicorn"]


def imported_by(module: str) -> set[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {m.split(".")[0] for m in json.loads(done.stdout)}


def test_policies_import_no_runtime_library():
    loaded = imported_by(
        "failsoft.policies.registry, failsoft.policies.detection, failsoft.synth, failsoft.orchestration"
    )
    assert not loaded & set(FORBIDDEN), loaded & set(FORBIDDEN)


def test_the_package_and_its_cli_import_light():
    loaded = imported_by("failsoft, failsoft.cli")
    assert not loaded & {"ray", "torch", "transformers"}, loaded & set(FORBIDDEN)


def _policy_import_graph() -> dict[str, set[str]]:
    """Module -> the failsoft.policies modules it imports (module level and inside functions)."""
    import ast
    from pathlib import Path

    import failsoft.policies

    root = Path(failsoft.policies.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t.startswith("failsoft.policies"))
        graph[module] = edges
    return {m: {e for e in edges if e in graph and e != m} for m, edges in graph.items()}


def test_the_policy_package_has_no_import_circle():
    graph = _policy_import_graph()
    assert graph.get("failsoft.policies.registry")
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError(f"import circle: {' -> '.join([*path, node, nxt])}")
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    importers = [m for m, edges in graph.items() if "failsoft.policies.registry" in edges]
    assert importers == [], f"policy modules import the registry back: {importers}"
