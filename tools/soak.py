"""Run a command again and again beside CPU hogs: do timing-sensitive runs hold up, and does any
of them declare a healthy server failed?

    PYTHONPATH=src python tools/soak.py --runs 20 --hogs 2 --budget-s 3600 \\
        -- tests/runtime/test_cluster.py -k "killed_under_load or controller_restart"
    PYTHONPATH=src python tools/soak.py --runs 20 --hogs 2 --exec --out soak-demo.json \\
        -- failsoft demo --down-s 2 --out /tmp/demo-{run}

Failure detection (40 ms of heartbeat silence), a controller restart and failover under load all
depend on the scheduler; a run that passes on a quiet machine may call a live server dead on a
busy one. This starts ``--hogs`` processes that spin (``while True: pass``, the simplest CPU
hog), runs the pytest selection (or, with ``--exec``, the command; ``{run}`` in it becomes the
run's number) ``--runs`` times in a row (each run in its own process group, killed after
``--run-timeout``), stops the hogs by PID, and prints one JSON object (also written to ``--out``).

Each run keeps a failure record (:mod:`failsoft.runtime.eventlog`: ``$FAILSOFT_EVENTS_LOG`` is set
to a file of its own, where the controller appends every event it publishes and the chaos module
every fault it injects), and the JSON counts from it, not from the run's verdict: per run the exit
status, the faults injected, the failures they caused (with the time from the fault to the
detection and what detected it), every *spurious* failure (a server nobody killed, hung or broke,
or one failed before the fault or again after it was back up) with its detail, the kills no failure
followed, the servers a deploy went on without (``not_started``: slow to start, counted apart), the
failure-related events, and the 1-minute load average at the run's start and end.
``--log-dir`` keeps each run's output and record. A run is not started when the budget left is
shorter than the longest run so far, so the whole soak stays bounded. The exit status is 1 when a
run failed or a spurious failure was seen.
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
import tempfile
import time
from pathlib import Path
from typing import Any

from failsoft.runtime import eventlog

HOG = "while True: pass"
SHOWN = ("chaos", "failure", "unhealthy", "server_up")  # the events a run's JSON lists one by one


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:  # by PID: only the processes this script started
        with contextlib.suppress(ProcessLookupError):
            hog.kill()
        hog.wait()


def command(args: argparse.Namespace, run: int) -> list[str]:
    if args.exec:
        return [a.replace("{run}", str(run)) for a in args.command]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.command]


def run_once(cmd: list[str], timeout_s: float, events_log: Path) -> tuple[int, str, float]:
    """Exit status (124 on timeout), output and seconds of one run in its own process group, its
    failure record kept in ``events_log``."""
    start = time.monotonic()
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its group: a timed-out run is stopped with everything it started
        env={**os.environ, eventlog.EVENTS_LOG_ENV: str(events_log)},
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


def count_events(records: list[dict[str, Any]], origin: float) -> dict[str, Any]:
    """What a run's failure record says: faults, caused and spurious failures, failure events."""
    verdict = eventlog.classify(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[str(r.get("type"))] = counts.get(str(r.get("type")), 0) + 1
    return {
        "faults": [
            {"server": f.server, "action": f.action, "at_s": round(f.at - origin, 3)} for f in verdict.faults
        ],
        "caused": [f.to_dict(origin) for f in verdict.caused],
        "spurious": len(verdict.spurious),
        "spurious_failures": [f.to_dict(origin) for f in verdict.spurious],
        "unanswered_faults": [{"server": f.server, "action": f.action} for f in verdict.unanswered],
        "not_started": [f.to_dict(origin) for f in verdict.not_started],
        "event_counts": dict(sorted(counts.items())),
        "events": [_brief(r, origin) for r in records if r.get("type") in SHOWN],
    }


def _brief(r: dict[str, Any], origin: float) -> dict[str, Any]:
    at = r.get("detected_at", r.get("timestamp", r.get("at", origin)))
    keep = ("type", "action", "server", "servers", "app", "cause", "kind")
    return {"t_s": round(float(at) - origin, 3), **{k: r[k] for k in keep if r.get(k) is not None}}


def soak(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="failsoft-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    hogs = start_hogs(args.hogs)
    try:
        for i in range(1, args.runs + 1):
            left = args.budget_s - (time.monotonic() - started)
            if runs and left < max(r["seconds"] for r in runs):
                break  # the next run would probably not finish within the budget
            events_log = log_dir / f"run-{i:03d}.events.jsonl"
            events_log.unlink(missing_ok=True)
            load_before, origin = os.getloadavg()[0], time.time()
            code, output, seconds = run_once(
                command(args, i), min(args.run_timeout, max(left, 1.0)), events_log
            )
            tail = output.strip().splitlines()[-1:] if output.strip() else []
            record = {
                "run": i,
                "exit": code,
                "seconds": round(seconds, 1),
                "load_1min_start": round(load_before, 2),
                "load_1min": round(os.getloadavg()[0], 2),
                "failed": failed_tests(output),
                "summary": tail[0] if tail else "",
                **count_events(eventlog.read(events_log), origin),
            }
            (log_dir / f"run-{i:03d}.log").write_text(output)
            runs.append(record)
            brief = {k: record[k] for k in ("run", "exit", "seconds", "load_1min", "spurious")}
            print(json.dumps(brief | {"faults": len(record["faults"])}), file=sys.stderr, flush=True)
    finally:
        stop_hogs(hogs)
    return summarize(args, runs)


def summarize(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    durations = [r["seconds"] for r in runs]
    loads = [r[k] for r in runs for k in ("load_1min_start", "load_1min")]
    return {
        "command": command(args, 0) if args.exec else args.command,
        "note": args.note,
        "hogs": args.hogs,
        "cpus": os.cpu_count(),
        "runs": len(runs),
        "passes": sum(r["exit"] == 0 for r in runs),
        "failures": sum(r["exit"] != 0 for r in runs),
        "faults": sum(len(r["faults"]) for r in runs),
        "caused_failures": sum(len(r["caused"]) for r in runs),
        "spurious_failures": sum(r["spurious"] for r in runs),
        "runs_with_spurious": [r["run"] for r in runs if r["spurious"]],
        "unanswered_faults": sum(len(r["unanswered_faults"]) for r in runs),
        "not_started": sum(len(r["not_started"]) for r in runs),
        "seconds": {"min": min(durations, default=0), "max": max(durations, default=0)},
        "load_1min": {"min": min(loads, default=0), "max": max(loads, default=0)},
        "per_run": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes beside the runs")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="no run starts past this")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="one run's limit (seconds)")
    parser.add_argument("--log-dir", default=None, help="keep each run's output and failure record here")
    parser.add_argument("--exec", action="store_true", help="the arguments are a command, not pytest's")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    parser.add_argument("--note", default="", help="a line kept in the JSON (the conditions of the soak)")
    parser.add_argument(
        "command", nargs="+", help="after --: what pytest runs (or, with --exec, the command)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be at least 1 and --hogs not negative")
    result = soak(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if result["failures"] == 0 and result["spurious_failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
