"""Run a pytest selection again and again beside CPU hogs: do timing-sensitive tests hold up?

    PYTHONPATH=src python tools/soak.py --runs 20 --hogs 2 --budget-s 3600 \\
        -- tests/runtime/test_cluster.py -k "killed_under_load or controller_restart"

Failure detection (40 ms of heartbeat silence), a controller restart and failover under load all
depend on the scheduler; a test that passes on a quiet machine may call a live server dead on a
busy one. This starts ``--hogs`` processes that spin (``while True: pass``, the simplest CPU
hog), runs the pytest selection ``--runs`` times in a row (each run in its own process group,
killed after ``--run-timeout``), stops the hogs by PID, and prints one JSON object: passes,
failures, each run's duration, exit status, failing tests and the 1-minute load average when it
ended. ``--log-dir`` keeps each run's output. A run is not started when the budget left
is shorter than the longest run so far, so the whole soak stays bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOG = "while True: pass"


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:  # by PID: only the processes this script started
        with contextlib.suppress(ProcessLookupError):
            hog.kill()
        hog.wait()


def run_once(pytest_args: list[str], timeout_s: float) -> tuple[int, str, float]:
    """Exit status (124 on timeout), output and seconds of one pytest run in its own process group."""
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its group: a timed-out run is stopped with everything it started
    )
    try:
        out, _ = child.communicate(timeout=timeout_s)
        code = child.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        code = 124
    return code, out.decode("utf-8", "replace"), time.monotonic() - start


def failed_tests(output: str) -> list[str]:
    return sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)))


def soak(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    hogs = start_hogs(args.hogs)
    try:
        for i in range(args.runs):
            left = args.budget_s - (time.monotonic() - started)
            if runs and left < max(r["seconds"] for r in runs):
                break  # the next run would probably not finish within the budget
            code, output, seconds = run_once(args.pytest_args, min(args.run_timeout, max(left, 1.0)))
            record = {
                "run": i + 1,
                "exit": code,
                "seconds": round(seconds, 1),
                "load_1min": round(os.getloadavg()[0], 2),
                "failed": failed_tests(output),
            }
            tail = output.strip().splitlines()[-1:] if output.strip() else []
            record["summary"] = tail[0] if tail else ""
            if log_dir:
                (log_dir / f"run-{i + 1:03d}.log").write_text(output)
            runs.append(record)
            print(json.dumps(record), file=sys.stderr, flush=True)
    finally:
        stop_hogs(hogs)
    durations = [r["seconds"] for r in runs]
    return {
        "selection": args.pytest_args,
        "hogs": args.hogs,
        "cpus": os.cpu_count(),
        "runs": len(runs),
        "passes": sum(r["exit"] == 0 for r in runs),
        "failures": sum(r["exit"] != 0 for r in runs),
        "seconds": {"min": min(durations, default=0), "max": max(durations, default=0)},
        "load_1min": {
            "min": min((r["load_1min"] for r in runs), default=0),
            "max": max((r["load_1min"] for r in runs), default=0),
        },
        "per_run": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes beside the tests")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="no run starts past this")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="one run's limit (seconds)")
    parser.add_argument("--log-dir", default=None, help="keep each run's output here")
    parser.add_argument("pytest_args", nargs="+", help="after --: what pytest runs")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be at least 1 and --hogs not negative")
    result = soak(args)
    print(json.dumps(result, indent=1))
    return 0 if result["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
