"""Run the checks in order within one budget, each in its own process with its own time box.

A check's box is the smaller of its own (:data:`BOXES`) and what is left of the budget less a
reserve for writing the result; a check whose box would be shorter than its minimum is not started
(``skipped``, with the seconds left). A check that runs out of its box is killed with every process
it started (Ray's included, found by walking its process tree, killed by id); a check that raised
is ``skipped`` too, with its error and the tail of its stderr. A check that ran and found something
wrong is ``defect``, its findings listed. The result is one JSON object, printed and written to
``$OUT/gpu-check.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ORDER = ("environment", "placement", "memory", "faillite", "restart", "lumen", "parm", "tests")
# (box on a GPU, box in the CPU rehearsal, minimum worth starting), seconds
BOXES: dict[str, tuple[float, float, float]] = {
    "environment": (45, 45, 10),
    "placement": (150, 120, 30),  # on a GPU its box includes building the small zoo
    "memory": (90, 120, 30),
    "faillite": (240, 180, 60),
    "restart": (90, 120, 30),
    "lumen": (180, 150, 45),
    "parm": (120, 150, 45),
    "tests": (90, 150, 30),
}
RESERVE_S = 5.0
# On a GPU, the failover benchmark's ImageNet families (ConvNeXt, ResNet at real sizes) take minutes
# to build: built in the background from the start, beside the first checks, into a zoo of their own.
BENCH_FAMILIES = ("convnext", "resnet", "digits_mlp", "digits_cnn")
TAIL_CHARS = 3000


@dataclass(frozen=True)
class Plan:
    dry: bool
    budget_s: float
    checks: tuple[str, ...]
    work: Path
    repo: Path
    prebuilt: Path | None
    env: dict[str, str]
    box_scale: float = 1.0


def run_all(plan: Plan, say: Any) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + plan.budget_s
    result: dict[str, Any] = {
        "dry_run": plan.dry,
        "budget_s": plan.budget_s,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checks": {},
    }
    prebuild = _start_prebuild(plan) if "faillite" in plan.checks and not plan.dry else None
    for name in plan.checks:
        if name == "faillite" and prebuild is not None:  # wait for it at most half the check's box
            wait = min(BOXES[name][0] * plan.box_scale / 2, deadline - time.monotonic() - RESERVE_S)
            result["prebuild"] = _finish_prebuild(prebuild, wait)
        own, dry_own, least = BOXES[name]
        left = deadline - time.monotonic() - RESERVE_S
        box = min((dry_own if plan.dry else own) * plan.box_scale, left)
        if box < least:
            result["checks"][name] = {
                "status": "skipped",
                "reason": f"budget: {max(left, 0):.0f} s left, the check needs at least {least:.0f} s",
            }
            say(f"[{name}] skipped: budget")
            continue
        say(f"[{name}] running (box {box:.0f} s)")
        result["checks"][name] = run_check(plan, name, box)
        say(f"[{name}] {result['checks'][name]['status']} in {result['checks'][name]['wall_s']} s")
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["summary"] = {n: c["status"] for n, c in result["checks"].items()}
    return result


def run_check(plan: Plan, name: str, box_s: float) -> dict[str, Any]:
    logs = plan.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out = plan.work / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    ctx = {"dry": plan.dry, "work": str(plan.work), "repo": str(plan.repo)}
    cmd = [sys.executable, str(plan.repo / "tools" / "gpu-check"), "--run-check", name]
    cmd += ["--ctx", json.dumps(ctx, default=str), "--result", str(out)]
    err_path = logs / f"{name}.stderr"
    started = time.monotonic()
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            cmd, cwd=plan.repo, env=plan.env, stdout=err, stderr=err, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=box_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_tree(proc)
    wall = round(time.monotonic() - started, 1)
    tail = err_path.read_text(errors="replace")[-TAIL_CHARS:]
    if rc is None:
        return {
            "status": "skipped",
            "reason": f"time box of {box_s:.0f} s ran out",
            "wall_s": wall,
            "stderr_tail": tail,
        }
    if rc != 0 or not out.is_file():
        last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
        return {
            "status": "skipped",
            "reason": f"failed (exit {rc}): {last[:300]}",
            "wall_s": wall,
            "stderr_tail": tail,
        }
    body = json.loads(out.read_text())
    status = "defect" if body.get("defects") else "ok"
    return {"status": status, "wall_s": wall, **body} | ({"stderr_tail": tail} if status == "defect" else {})


def _start_prebuild(plan: Plan) -> tuple[subprocess.Popen[bytes], float, Path]:
    cmd = [sys.executable, "-m", "failsoft", "zoo", "build", "--quick", "--out", str(bench_zoo(plan.work))]
    for family in BENCH_FAMILIES:
        cmd += ["-f", family]
    log = plan.work / "logs" / "prebuild.stderr"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, cwd=plan.repo, env=plan.env, stdout=err, stderr=err, start_new_session=True
        )
    return proc, time.monotonic(), log


def _finish_prebuild(prebuild: tuple[subprocess.Popen[bytes], float, Path], left_s: float) -> dict[str, Any]:
    """Wait for the background build (the failover check completes whatever it left unbuilt)."""
    proc, started, log = prebuild
    try:
        rc: int | None = proc.wait(timeout=max(left_s, 1.0))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        _kill_tree(proc)
    return {"rc": rc, "wall_s": round(time.monotonic() - started, 1), "log_tail": log.read_text()[-500:]}


def bench_zoo(work: Path) -> Path:
    """The failover benchmark's model repository (its families at real size)."""
    return work / "zoo-bench"


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Stop the check and every process it started (Ray's raylet, GCS and workers), by id."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a failsoft dependency
        psutil = None
    victims: list[Any] = []
    if psutil is not None:
        with contextlib.suppress(psutil.Error):
            victims = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group it leads
    for child in victims:
        with contextlib.suppress(Exception):
            child.kill()
    proc.wait()


def describe(plan: Plan) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items() if k != "env"}
