"""Time ``failsoft simulate`` in two source trees side by side, and check they wrote the same rows.

    python tools/sim_speed.py --base ../failsoft-6a28633 --new . --rounds 2 \\
        --out docs/results/sim-speed-headroom.json -- headroom --seeds 1

A speed-up is only worth its name measured in one run on one machine, and on a shared machine wall
time measures the neighbours: so each round runs the simulation once in each tree (base, new, base,
new, ...: a drift of the machine's load hits both; ``--parallel``: both at once, each round),
each in a fresh interpreter with
``PYTHONPATH`` at that tree's ``src``, and takes the CPU time the process used (user + system, from
``wait4``), beside its wall time and the load average. It then compares each tree's
``results.csv`` row for row, every column but the wall-clock ones (``plan_ms``, ``plan_max_ms``,
``proactive_ms``, ``sim_ms``): a faster simulator must compute the same results. Prints and writes
one JSON object: per run the tree, CPU and wall seconds, load; the ratio of the median CPU times
(base / new); and whether the results are identical. Exit status 1 when they are not.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WALL_COLUMNS = ("plan_ms", "plan_max_ms", "proactive_ms", "sim_ms")


def start(tree: Path, args: list[str], out: Path) -> tuple[subprocess.Popen[bytes], float, float]:
    """One ``simulate`` started in ``tree``, with the load average and the time it began."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, "-m", "failsoft", "simulate", *args, "--out", str(out)]
    load = os.getloadavg()[0]
    err = (out.parent / f"{out.name}.stderr").open("wb")
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    return child, load, time.monotonic()


def finish(
    tree: Path,
    started: tuple[subprocess.Popen[bytes], float, float],
    out: Path,
    reaped: tuple[int, Any] | None = None,
) -> dict[str, Any]:
    """Wait for it (unless ``reaped`` already: its status and usage): its CPU seconds (``wait4``:
    its own and its children's) and wall seconds."""
    child, load, began = started
    if reaped is None:
        _, status, usage = os.wait4(child.pid, 0)
    else:
        status, usage = reaped
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        err = (out.parent / f"{out.name}.stderr").read_text()[-2000:]
        raise SystemExit(f"simulate failed in {tree} (exit {child.returncode}):\n{err}")
    return {
        "tree": str(tree),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round(time.monotonic() - began, 2),
        "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def compare(base: Path, new: Path) -> dict[str, Any]:
    """Row by row, the columns both wrote but the wall-clock ones."""
    (base_cols, base_rows), (new_cols, new_rows) = rows(base), rows(new)
    columns = [c for c in base_cols if c in new_cols and c not in WALL_COLUMNS]
    differing = [
        {"row": i, "column": c, "base": b[c], "new": n[c]}
        for i, (b, n) in enumerate(zip(base_rows, new_rows, strict=False))
        for c in columns
        if b[c] != n[c]
    ]
    return {
        "rows": [len(base_rows), len(new_rows)],
        "columns_compared": len(columns),
        "columns_only_in_base": [c for c in base_cols if c not in new_cols],
        "columns_only_in_new": [c for c in new_cols if c not in base_cols],
        "differences": differing[:20],
        "identical": len(base_rows) == len(new_rows) and not differing,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2, help="runs in each tree, alternated")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--parallel", action="store_true", help="run each round's two at once")
    parser.add_argument("simulate", nargs="+", help="after --: simulate's arguments")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="failsoft-sim-speed-"))
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for i in range(args.rounds):
        trees = {name: getattr(args, name).resolve() for name in ("base", "new")}
        if args.parallel:  # both at once: the same load on each (CPU time, not wall, compares them)
            begun = {name: start(trees[name], args.simulate, work / f"{name}-{i}") for name in trees}
            by_pid = {begun[name][0].pid: name for name in trees}
            done = {}
            while by_pid:  # reaped as each ends, so that each wall time is its own
                pid, status, usage = os.wait4(-1, 0)
                if pid in by_pid:
                    name = by_pid.pop(pid)
                    done[name] = finish(trees[name], begun[name], work / f"{name}-{i}", (status, usage))
            for name in trees:
                runs[name].append(done[name])
        else:
            for name in trees:
                out = work / f"{name}-{i}"
                runs[name].append(finish(trees[name], start(trees[name], args.simulate, out), out))
        print(json.dumps({name: runs[name][-1] for name in trees}), file=sys.stderr, flush=True)
    cpu = {name: statistics.median(r["cpu_s"] for r in runs[name]) for name in runs}
    result = {
        "simulate": args.simulate,
        "parallel": args.parallel,
        "cpus": os.cpu_count(),
        "runs": runs,
        "cpu_s_median": cpu,
        "speedup_cpu": round(cpu["base"] / cpu["new"], 3),
        "results": compare(work / "base-0" / "results.csv", work / "new-0" / "results.csv"),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if result["results"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
