"""One wrapper owns every Ray call: only failsoft/runtime/cluster.py imports ray."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "failsoft"


def imports_ray(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "ray"
        ):
            return True
    return False


def test_only_the_cluster_wrapper_imports_ray():
    """failsoft reaches Ray through one wrapper. The one other importer is no part of failsoft: the
    serving benchmark's Ray Serve anchor, the foreign system it is compared with, run in a process
    (and a Ray instance) of its own."""
    importers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if imports_ray(p))
    assert importers == ["bench/serving_anchor_rayserve.py", "runtime/cluster.py"]


def test_the_sidecar_needs_only_the_standard_library():
    tree = ast.parse((SRC / "runtime" / "pulse.py").read_text())
    modules = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert not modules & {"failsoft", "numpy", "ray", "torch", "pydantic"}, modules


def test_the_gateway_app_knows_no_mode():
    """The gateway's app reaches each mode through the dispatch contract and the factory only: it
    imports no dispatcher module, no mode class (not even re-exported by the factory) and no mode's
    own endpoints module; those come from :meth:`Dispatcher.http_routes`."""
    import failsoft.runtime.gateway.dispatch as factory
    from failsoft.runtime.gateway.dispatch.interface import Dispatcher

    allowed = {"failsoft.runtime.gateway.dispatch", "failsoft.runtime.gateway.dispatch.interface"}
    tree = ast.parse((SRC / "runtime" / "gateway" / "app.py").read_text())
    imported: list[tuple[str, str]] = []  # (module, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            imported += [(a.name, "") for a in node.names]
    modules = {m if not n else f"{m}.{n}" for m, n in imported}
    dispatch = {m for m, _ in imported if m.startswith("failsoft.runtime.gateway.dispatch")}
    assert dispatch and dispatch <= allowed, sorted(dispatch - allowed)
    assert not {m for m in modules if m.startswith("failsoft.runtime.gateway.slo")}, modules
    for module, name in imported:
        if module == "failsoft.runtime.gateway.dispatch":
            obj = getattr(factory, name)
            assert not (isinstance(obj, type) and issubclass(obj, Dispatcher) and obj is not Dispatcher), name


def model_calls(path: Path, root: Path = SRC) -> list[str]:
    """Calls in ``path`` that load or unload a model: ``<anything>.load(...)`` or ``.unload(...)``
    with arguments (an LLM worker's argument-less ``load()`` is a report of its load, not a model)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno}: .{node.func.attr}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("load", "unload")
        and (node.args or node.keywords)
    ]


def test_no_dispatcher_loads_or_unloads_a_model_itself(tmp_path: Path):
    """Every copy in the cluster is the orchestration core's: a dispatcher asks for one
    (``DispatchContext.copies``: pin, unpin) and the core plans, counts and publishes it; a
    promotion is the core's failover moving the route. So nothing in the gateway calls an agent's
    ``load``/``unload``; the AST check is checked against a line that would break it."""
    gateway = SRC / "runtime" / "gateway"
    found = [c for p in sorted(gateway.rglob("*.py")) for c in model_calls(p)]
    assert found == [], found
    bad = tmp_path / "probe.py"
    bad.write_text("async def f(agent):\n    await agent.load('a', 'fam', 'v', background=True)\n")
    assert model_calls(bad, tmp_path) == ["probe.py:2: .load(...)"]


def test_an_agent_s_process_imports_no_solver_and_no_config_models():
    """Every agent, controller and LLM worker is a process of its own that imports its module at
    start (a second of a core each, a test session starts over a hundred): scipy is imported where a
    solver builds its matrix and the config's pydantic models where a config is read, neither of
    which an agent does. A top-level import creeping back would cost each start without failing."""
    probe = (
        "import json, sys, failsoft.runtime.agent, failsoft.runtime.llm_worker\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.split('.')[0] == 'scipy' or m.startswith('failsoft.runtime.config'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [], out.stdout
