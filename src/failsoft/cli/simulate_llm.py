"""``failsoft simulate llm-recovery`` and ``llm-recovery-sweep``: LUMEN on the LLM cluster simulator.

Writes ``results.csv``, ``summary.json`` and ``EXPERIMENT.png`` into ``--out`` and prints a JSON
digest (paths, each policy's mean TTFT, TPOT and recovery time, and at 4 workers LUMEN against each
baseline beside the review's numbers); one progress line per run on stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from failsoft.sim.llm import get_llm_experiment, run_llm_experiment
from failsoft.sim.llm.output import llm_summary, write_llm_outputs

_DIGEST = ("ttft_ms_mean", "tpot_ms_mean", "recovery_ms", "reload_ms", "failed_requests")


def simulate_llm(
    name: str, out: Path | None, seeds: int, policies: Sequence[str] | None, quick: bool
) -> None:
    exp = get_llm_experiment(name, quick, policies)
    started = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        typer.echo(
            f"{exp.name} {row['label']} seed {row['seed']} {row['policy']}: "
            f"TTFT {row['ttft_ms_mean']:.0f} ms, recovery {row['recovery_ms']:.0f} ms "
            f"({time.perf_counter() - started:.1f} s)",
            err=True,
        )

    result = run_llm_experiment(exp, seeds=seeds, on_row=on_row)
    paths = write_llm_outputs(result, out or Path("out") / "sim" / exp.name)
    full = llm_summary(result)
    digest = {
        "experiment": full["experiment"],
        "seeds": len(full["seeds"]),
        "wall_s": full["wall_s"],
        "outputs": paths,
        "by_point": {
            f"{e['label']} {e['policy']}": {m: e[m]["mean"] for m in _DIGEST if m in e}
            for e in full["by_point"]
        },
    }
    if "vs_review_4_workers" in full:
        digest["vs_review_4_workers"] = full["vs_review_4_workers"]
    typer.echo(json.dumps(digest, indent=2))
    typer.echo(
        f"simulate {exp.name}: {len(result.rows)} rows in {result.wall_s:.1f} s; wrote\n"
        + "\n".join(f"  {p}" for p in paths.values()),
        err=True,
    )
