"""The GPU checks, each run by :mod:`gpucheck.runner` in a process of its own.

Each check is a function ``(ctx) -> dict`` that returns its figures and a ``defects`` list (what it
found wrong: an agent that does not see the GPU, a model that loaded on the CPU). ``ctx.dry`` is the
CPU rehearsal: the smallest sizes, an embedded Ray node that offers one GPU no device backs
(``FAILSOFT_NUM_GPUS=1``: Ray's grant and ``CUDA_VISIBLE_DEVICES`` are real, torch finds no CUDA),
``device: auto`` where the real run says ``cuda``, and no device figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Ctx:
    dry: bool
    work: Path  # this run's scratch folder (zoos, configs, state)
    repo: Path  # the repository root

    @property
    def zoo(self) -> Path:
        """The model repository every check shares (``--prebuilt``'s copy, completed here)."""
        return self.work / "zoo"

    @property
    def device(self) -> str:
        """What the configs ask for: ``cuda`` on a GPU, ``auto`` in the CPU rehearsal."""
        return "auto" if self.dry else "cuda"

    @property
    def num_gpus(self) -> int | None:
        return 1 if self.dry else None


# ------------------------------------------------------------------------------------------------
# Shared helpers.
# ------------------------------------------------------------------------------------------------


def zoo(ctx: Ctx, families: list[str]) -> Path:
    """A model repository holding ``families`` (``family`` or ``family/variant``), quick profiles,
    profiled on the device the checks use (idempotent: what ``--prebuilt`` brought is kept)."""
    from failsoft.zoo.build import build_zoo
    from failsoft.zoo.profiler import QUICK

    root = ctx.zoo
    build_zoo(root, families=families, settings=QUICK, device="cpu" if ctx.dry else None)
    return root


def config(ctx: Ctx, name: str, body: dict[str, Any]) -> Any:
    from failsoft.runtime.config import config_from_dict

    base = {"name": name, "gateway": {"port": 0}, "state_dir": str(ctx.work / "state" / name)}
    return config_from_dict(base | body, source=f"gpu-check {name}")


def write_yaml(ctx: Ctx, name: str, data: dict[str, Any]) -> Path:
    path = ctx.work / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def failsoft_cli(ctx: Ctx, args: list[str], timeout_s: float, out: Path | None = None) -> dict[str, Any]:
    """``python -m failsoft ARGS``; its JSON (``--out`` file, else stdout's last JSON object)."""
    env = dict(os.environ)
    if ctx.dry:
        env["FAILSOFT_NUM_GPUS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "failsoft", *args],
        cwd=ctx.repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,  # the runner keeps the tail
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"failsoft {' '.join(args[:2])} exited {proc.returncode}: {proc.stdout[-800:]}")
    if out is not None and out.is_file():
        return dict(json.loads(out.read_text()))
    start = proc.stdout.find("{")
    return dict(json.loads(proc.stdout[start:]))


def agent_view(ref: Any, loads: list[tuple[str, str, str]]) -> dict[str, Any]:
    """What one agent reports: its device, Ray's grant, and where each of ``loads`` (app, family,
    variant: already loaded, so this repeats them, which is a no-op) runs."""
    info = ref.info_sync()
    models = {}
    for app, family, variant in loads:
        described = asyncio.run(ref.load(app, family, variant, timeout_s=120.0))
        models[app] = {
            "variant": variant,
            "device": described["device"],
            "memory_mb": described["memory_mb"],
            "input_shape": described["input_shape"],
        }
    return {"pid": info["pid"], "device": info["device"], "startup": info["startup"], "models": models}


def expect(defects: list[str], ok: bool, message: str) -> None:
    if not ok:
        defects.append(message)


# ------------------------------------------------------------------------------------------------
# 0. The machine.
# ------------------------------------------------------------------------------------------------


def environment(ctx: Ctx) -> dict[str, Any]:
    """Python, torch, CUDA, the GPU, NVML, and the versions of what was carried."""
    import importlib.metadata as md

    import torch

    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "dry_run": ctx.dry,
        "packages": {},
        "defects": [],
    }
    for name in ("ray", "pydantic", "fastapi", "uvicorn", "transformers", "nvidia-ml-py"):
        try:
            out["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            out["packages"][name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = {
            "name": props.name,
            "memory_mb": round(props.total_memory / 2**20),
            "count": torch.cuda.device_count(),
        }
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        out["nvidia_smi"] = smi.stdout.strip()[:400]
    expect(out["defects"], ctx.dry or out["cuda_available"], "torch sees no CUDA device on the GPU machine")
    expect(
        out["defects"], out["packages"]["ray"] is not None, "ray is not importable: was the carry unpacked?"
    )
    return out


# ------------------------------------------------------------------------------------------------
# 1. Visibility and placement under the serving session (what `failsoft serve` runs).
# ------------------------------------------------------------------------------------------------


def placement(ctx: Ctx) -> dict[str, Any]:
    """Four agents: a GPU share with ``cuda``, one with ``auto``, one pinned to ``cuda:0`` of the
    machine, and one with no share (it must see no GPU and serve on the CPU)."""
    from failsoft.runtime.session import Session

    if ctx.dry:
        root = zoo(ctx, ["digits_mlp"])
        homes = {
            "g-cuda": ("digits_mlp", "mlp_s"),
            "g-auto": ("digits_mlp", "mlp_m"),
            "c-none": ("digits_mlp", "mlp_s"),
        }
    else:
        root = zoo(ctx, ["digits_mlp", "resnet/resnet18"])
        homes = {
            "g-cuda": ("resnet", "resnet18"),
            "g-auto": ("digits_mlp", "mlp_m"),
            "g-pin": ("digits_mlp", "mlp_l"),
            "c-none": ("digits_mlp", "mlp_s"),
        }
    servers = [
        {"name": "g-cuda", "site": "a", "memory_mb": 4096, "device": ctx.device, "gpus": 0.25},
        {"name": "g-auto", "site": "a", "memory_mb": 4096, "device": "auto", "gpus": 0.25},
        {
            "name": "g-pin",
            "site": "b",
            "memory_mb": 4096,
            "device": "auto" if ctx.dry else "cuda:0",
            "gpus": 0.25,
        },
        {"name": "c-none", "site": "b", "memory_mb": 4096, "device": "auto"},
    ]
    apps = [
        {"name": f"app-{s}", "family": f, "rate_rps": 1, "primary": {"server": s, "variant": v}}
        for s, (f, v) in homes.items()
    ]
    cfg = config(ctx, "placement", {"repository": str(root), "servers": servers, "apps": apps})
    started = time.perf_counter()
    session = Session(cfg, num_gpus=ctx.num_gpus).start()
    out: dict[str, Any] = {"start_s": round(time.perf_counter() - started, 2), "servers": {}, "defects": []}
    try:
        client = session.client(timeout=30.0)
        for s in servers:
            name = s["name"]
            home = homes.get(name)
            loads = [(f"app-{name}", *home)] if home else []
            view = agent_view(session.agents[name], loads)
            view["placement"] = {"device": s["device"], "gpus": s.get("gpus", 0)}
            if home:
                import numpy as np

                shape = view["models"][f"app-{name}"]["input_shape"]

                answer = client.infer(
                    f"app-{name}", np.random.default_rng(0).random((1, *shape), dtype=np.float32)
                )
                view["answered_by"] = answer.server
            out["servers"][name] = view
            _judge_placement(ctx, name, s, view, out["defects"])
        client.close()
    finally:
        session.stop()
    return out


def _judge_placement(
    ctx: Ctx, name: str, spec: dict[str, Any], view: dict[str, Any], defects: list[str]
) -> None:
    device, granted = view["device"], view["device"].get("granted", {})
    share = float(spec.get("gpus", 0))
    expect(
        defects,
        abs(granted.get("resources", {}).get("GPU", 0.0) - share) < 1e-9,
        f"{name}: Ray granted {granted.get('resources')} for a share of {share}",
    )
    if share == 0:
        expect(
            defects,
            device["visible"] == "",
            f"{name}: no GPU share, but CUDA_VISIBLE_DEVICES={device['visible']!r}",
        )
        expect(
            defects,
            all(m["device"] == "cpu" for m in view["models"].values()),
            f"{name}: no share, yet {view['models']}",
        )
        return
    expect(defects, device["visible"] not in (None, ""), f"{name}: a GPU share, but no CUDA_VISIBLE_DEVICES")
    if not ctx.dry:
        expect(
            defects,
            device["memory"].get("cuda") is True,
            f"{name}: its actor does not see the GPU ({device})",
        )
        for app, m in view["models"].items():
            expect(
                defects, m["device"].startswith("cuda"), f"{name}: {app} loaded on {m['device']}, not the GPU"
            )


# ------------------------------------------------------------------------------------------------
# 2. Memory accounting against the device.
# ------------------------------------------------------------------------------------------------


def memory(ctx: Ctx) -> dict[str, Any]:
    """Two agents share the GPU with models, a third holds none (its use is its CUDA context alone):
    each one's accounted memory (profiled ``memory_mb`` of what it holds) beside what the device
    reports for its process (NVML, context included), torch's allocator, and the device's free memory."""
    from failsoft.runtime.session import Session

    if ctx.dry:
        root = zoo(ctx, ["digits_mlp"])
        homes = {
            "m1": [("digits_mlp", "mlp_l"), ("digits_mlp", "mlp_m")],
            "m2": [("digits_mlp", "mlp_s")],
            "m0": [],
        }
    else:
        root = zoo(ctx, ["digits_mlp", "resnet/resnet18", "resnet/resnet50"])
        homes = {
            "m1": [("resnet", "resnet50"), ("digits_mlp", "mlp_l")],
            "m2": [("resnet", "resnet18")],
            "m0": [],
        }
    servers = [{"name": n, "site": "a", "memory_mb": 8192, "device": ctx.device, "gpus": 0.3} for n in homes]
    apps = [
        {"name": f"{n}-{i}", "family": f, "rate_rps": 1, "primary": {"server": n, "variant": v}}
        for n, held in homes.items()
        for i, (f, v) in enumerate(held)
    ]
    cfg = config(ctx, "memory", {"repository": str(root), "servers": servers, "apps": apps})
    session = Session(cfg, num_gpus=ctx.num_gpus).start()
    out: dict[str, Any] = {"agents": {}, "defects": []}
    try:
        for name, held in homes.items():
            loads = [(f"{name}-{i}", f, v) for i, (f, v) in enumerate(held)]
            view = agent_view(session.agents[name], loads)
            dev = view["device"]
            row = {"accounted_mb": dev["accounted_mb"], "models": view["models"], **dev["memory"]}
            if dev["memory"].get("cuda"):  # what torch holds beyond what the budget counts
                row["reserved_minus_accounted_mb"] = round(
                    dev["memory"]["torch_reserved_mb"] - dev["accounted_mb"], 1
                )
            if ctx.dry:
                import psutil

                row["rss_mb"] = round(psutil.Process(view["pid"]).memory_info().rss / 2**20, 1)
            out["agents"][name] = row
        if not ctx.dry:
            mem = [a for a in out["agents"].values() if a.get("cuda")]
            expect(out["defects"], len(mem) == len(homes), "not every agent reported device memory")
            contexts = [a["context_mb"] for a in mem if a.get("context_mb") is not None]
            expect(
                out["defects"], bool(contexts), "NVML gave no per-process memory (is nvidia-ml-py installed?)"
            )
            if contexts:
                out["context_mb_per_process"] = {"min": min(contexts), "max": max(contexts)}
                out["note"] = (
                    "accounted_mb excludes the CUDA context: a server's memory_mb budget covers its models, "
                    "the context is per agent process on top of it"
                )
    finally:
        session.stop()
    return out


# ------------------------------------------------------------------------------------------------
# 3. FailLite on the GPU: the failover benchmark.
# ------------------------------------------------------------------------------------------------


def faillite(ctx: Ctx) -> dict[str, Any]:
    """``bench failover examples/bench.yaml -p faillite -p full-warm-k`` (one repeat) on the GPU:
    every server a share of it (6 x 0.15). The dry run uses a digits-only cluster of four servers."""
    base = yaml.safe_load((ctx.repo / "examples" / "bench.yaml").read_text())
    if ctx.dry:
        base["servers"] = base["servers"][:2] + base["servers"][2:4]
        keep = {"ocr-1", "cam-1", "ocr-2", "cam-2"}
        base["apps"] = [a for a in base["apps"] if a["name"] in keep]
        zoo(ctx, ["digits_mlp", "digits_cnn"])
        window = "4"
    else:
        window = "20"  # the bench builds the families it lacks (ConvNeXt, ResNet) into the same zoo
    # on a GPU the runner built the families in the background; the bench builds what is missing
    base["repository"] = str(ctx.zoo if ctx.dry else ctx.work / "zoo-bench")
    base["agents"] = {**base.get("agents", {}), "device": ctx.device, "gpus": 0.15}
    path = write_yaml(ctx, "bench-gpu", base)
    out_file = ctx.work / "bench-failover.json"
    args = ["bench", "failover", str(path), "-p", "faillite", "-p", "full-warm-k", "--repeats", "1"]
    bench = failsoft_cli(ctx, [*args, "--window-s", window], timeout_s=3600)
    out_file.write_text(json.dumps(bench))
    return {"figures": _failover_figures(ctx, bench, base), "bench": bench, "defects": []}


def _failover_figures(ctx: Ctx, bench: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The issue's figures: detection, warm outage, the MTTR ratio, each progressive app's MTTR over
    its first variant's standalone load (the zoo's profile on this machine), and warm first answers."""
    from failsoft.zoo import ModelRepository, default_zoo_path

    fl = bench["policies"].get("faillite", {})
    repo = ModelRepository(cfg.get("repository") or default_zoo_path())
    families = {a["name"]: a["family"] for a in cfg["apps"]}
    progressive = {}
    warm_first = {}
    for app, runs in fl.get("recovered_as", {}).items():
        for run in runs:
            if not run:
                continue
            kind, variants = run.split(":", 1)
            first = variants.split("->")[0]
            mttr = fl["mttr_ms"]["per_app"].get(app)
            if kind == "progressive" and mttr is not None:
                load = repo.variant(families[app], first).load_ms
                progressive[app] = {
                    "first_variant": first,
                    "mttr_ms": mttr,
                    "standalone_load_ms": round(load, 1),
                    "mttr_over_load": round(mttr / load, 2) if load else None,
                }
            if kind == "warm":
                warm_first[app] = fl["first_answer_ms"]["per_app"].get(app)
    return {
        "targets": bench.get("targets", {}),
        "detection_ms": {p: v["detection_ms"] for p, v in bench["policies"].items()},
        "mttr_by_kind_ms": {p: v["mttr_by_kind_ms"] for p, v in bench["policies"].items()},
        "recovery_rate": {p: v["recovery_rate"] for p, v in bench["policies"].items()},
        "progressive_mttr_over_standalone_load": progressive,
        "warm_switch_first_answer_ms": warm_first,
    }


# ------------------------------------------------------------------------------------------------
# 4. Agent restart on the GPU, split.
# ------------------------------------------------------------------------------------------------


def restart(ctx: Ctx) -> dict[str, Any]:
    """Kill a GPU server's agent (SIGKILL, Ray restarts it) and split kill -> ``server_up`` -> first
    load: Ray noticing and starting a process (or taking one its pool started earlier), the actor's
    start in it with failsoft's imports, torch and
    the families' imports, the CUDA context (created at start, before the first heartbeat: the cut,
    so a recovery load does not pay it), heartbeat to ``server_up``, then a first load."""
    from failsoft.runtime.session import Session

    family, variant, probe = (
        ("digits_mlp", "mlp_m", "mlp_s") if ctx.dry else ("resnet", "resnet18", "resnet34")
    )
    root = zoo(ctx, ["digits_mlp"] if ctx.dry else ["digits_mlp", "resnet/resnet18", "resnet/resnet34"])
    servers = [
        {"name": "r1", "site": "a", "memory_mb": 8192, "device": ctx.device, "gpus": 0.4},
        {"name": "r2", "site": "b", "memory_mb": 8192, "device": "cpu"},
    ]
    apps = [{"name": "app", "family": family, "rate_rps": 1, "primary": {"server": "r1", "variant": variant}}]
    cfg = config(ctx, "restart", {"repository": str(root), "servers": servers, "apps": apps})
    session = Session(cfg, num_gpus=ctx.num_gpus).start()
    out: dict[str, Any] = {"defects": []}
    try:
        client = session.client(timeout=10.0)
        agent = session.agents["r1"]
        before = agent.info_sync()
        kill_at = time.time()
        agent.crash_nowait()
        after = _wait(lambda: _new_incarnation(agent, before["incarnation"]), 120.0, "the restarted agent")
        up_at = _wait(lambda: _server_up(client, "r1", after["incarnation"]), 60.0, "server_up")
        load = asyncio.run(agent.load("probe", family, probe, timeout_s=120.0))
        s = after["startup"]
        # Ray may restart the actor in a worker process it started before the kill (its pool)
        process_at = max(s["process_started_at"], kill_at)
        out["process_prestarted_by_ray"] = s["process_started_at"] < kill_at
        out["split_ms"] = {
            "kill_to_process": round((process_at - kill_at) * 1000, 1),
            "process_to_agent_init": round((s["init_at"] - process_at) * 1000, 1),
            "torch_and_model_imports": round(s["imports_ms"], 1),
            "cuda_context": round(s["cuda_context_ms"], 1),
            "ready_to_server_up": round((up_at - s["ready_at"]) * 1000, 1),
            "kill_to_server_up": round((up_at - kill_at) * 1000, 1),
            "first_load": round(load["load_ms"], 1),
        }
        out["first_load_device"] = load["device"]
        out["without_the_cut_ms"] = _cold_load_with_context(ctx, root, family, probe)
        client.close()
    finally:
        session.stop()
    return out


def _new_incarnation(agent: Any, old: str) -> dict[str, Any] | None:
    try:
        info = agent.info_sync(timeout_s=2.0)
    except Exception:
        return None
    return info if info["incarnation"] != old else None


def _server_up(client: Any, server: str, incarnation: str) -> float | None:
    status = client.status()
    for s in status.get("servers", []):
        if s.get("name") == server and str(s.get("state", "")).lower() == "up":
            return time.time()
    return None


def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {timeout_s} s")


def _cold_load_with_context(ctx: Ctx, root: Path, family: str, variant: str) -> dict[str, float] | None:
    """The same load in a fresh GPU process that has not created its CUDA context: what a first
    load paid before agents created it at start (None in the dry run: no CUDA)."""
    if ctx.dry:
        return None
    import ray

    @ray.remote(num_gpus=0.1, num_cpus=0)
    def cold(root: str) -> dict[str, float]:
        import torch

        from failsoft.zoo import ModelRepository

        repo = ModelRepository(root)
        t = time.perf_counter()
        with repo.load(family, variant, "cuda") as model:
            model.predict(model.example_batch(1))
            torch.cuda.synchronize()
            return {"load_and_first_answer_ms": round((time.perf_counter() - t) * 1000, 1)}

    return dict(ray.get(cold.remote(str(root)), timeout=120))


# ------------------------------------------------------------------------------------------------
# 5. LUMEN on the GPU.
# ------------------------------------------------------------------------------------------------


def lumen(ctx: Ctx) -> dict[str, Any]:
    """``llm real-size tinyllama-1.1b --device cuda`` (cold and warm reload), then ``bench llm`` with
    the warm reload as ``--reload-ms``, per policy, its workers on the GPU (4 x 0.15 of it)."""
    size_out = ctx.work / "llm-realsize.json"
    if ctx.dry:
        real = failsoft_cli(
            ctx, ["llm", "real-size", "tinyllama-1.1b", "--analytic", "--out", str(size_out)], 120, size_out
        )
        reload_ms = 200.0  # the rehearsal's stand-in: nothing was loaded
    else:
        args = ["llm", "real-size", "tinyllama-1.1b", "--device", "cuda", "--repeats", "1"]
        real = failsoft_cli(
            ctx, [*args, "--root", str(ctx.work / "realsize"), "--out", str(size_out)], 600, size_out
        )
        reload_ms = float(real["shapes"]["tinyllama-1.1b"]["reload"]["warm"]["reload_ms_mean"])
    cfg = yaml.safe_load((ctx.repo / "examples" / "llm.yaml").read_text())
    cfg["model"] = {**cfg["model"], "device": ctx.device, "gpus": 0.15, "root": str(ctx.work / "llm")}
    path = write_yaml(ctx, "llm-gpu", cfg)
    bench_out = ctx.work / "bench-llm.json"
    requests = "8" if ctx.dry else "40"
    args = [
        "bench",
        "llm",
        str(path),
        "--requests",
        requests,
        "--reload-ms",
        f"{reload_ms:.0f}",
        "--out",
        str(bench_out),
    ]
    if ctx.dry:
        args += ["-p", "lumen", "--kill-at-s", "0.5"]
    bench = failsoft_cli(ctx, args, 3600, bench_out)
    shape = real["shapes"]["tinyllama-1.1b"]
    return {
        "realsize": {k: shape.get(k) for k in ("measured", "weight_gib", "reload", "loads")},
        "reload_ms_used": reload_ms,
        "policies": {
            p: {k: v.get(k) for k in ("ttft_ms", "tpot_ms", "recovery_ms", "restart_ms", "failed_requests")}
            for p, v in bench["policies"].items()
        },
        "bench": bench,
        "defects": [],
    }


# ------------------------------------------------------------------------------------------------
# 6. ParM on the GPU.
# ------------------------------------------------------------------------------------------------


def parm(ctx: Ctx) -> dict[str, Any]:
    """``bench coding examples/coded-resnet18.yaml`` with a straggler: ParM's p99.9 against
    Equal-Resources. The dry run uses the digits coded service (examples/coded.yaml)."""
    root = ctx.zoo
    if ctx.dry:
        zoo(ctx, ["digits_mlp"])
        example, train = "coded.yaml", ["digits_mlp/mlp_m", "--k", "2", "--random-weights"]
        rate, slow, duration = "10", "50", "4"
    else:
        zoo(ctx, ["resnet/resnet18"])
        example, train = "coded-resnet18.yaml", ["resnet/resnet18", "--k", "2", "--random-weights"]
        rate, slow, duration = "10", "200", "20"
    failsoft_cli(ctx, ["parity", "train", *train, "--root", str(root), "--quick"], 600)
    cfg = yaml.safe_load((ctx.repo / "examples" / example).read_text())
    cfg["agents"] = {**cfg.get("agents", {}), "device": ctx.device, "gpus": 0.2}
    cfg["gateway"] = {**cfg.get("gateway", {}), "port": 0}
    path = write_yaml(ctx, "coded-gpu", cfg)
    out_file = ctx.work / "bench-coding.json"
    args = ["bench", "coding", str(path), "--root", str(root), "--rate-rps", rate, "--slow-ms", slow]
    args += [
        "--duration-s",
        duration,
        "-p",
        "parm",
        "-p",
        "equal-resources",
        "--no-failover",
        "--out",
        str(out_file),
    ]
    bench = failsoft_cli(ctx, args, 3600, out_file)
    lat = {p: v.get("latency_ms") for p, v in bench["policies"].items()}
    p999 = {p: (v or {}).get("p999") for p, v in lat.items()}
    ratio = None
    if p999.get("parm") and p999.get("equal-resources"):
        ratio = round(p999["equal-resources"] / p999["parm"], 2)
    return {"latency_ms": lat, "p999_equal_resources_over_parm": ratio, "bench": bench, "defects": []}


# ------------------------------------------------------------------------------------------------
# 7. The placement tests, on the device.
# ------------------------------------------------------------------------------------------------


def tests(ctx: Ctx) -> dict[str, Any]:
    """``tests/runtime/test_gpu_placement.py`` and ``test_devices.py``: on a GPU they check the
    granted GPU for real (the agent sees it, loads on it, creates its context at start);
    ``test_agent_metrics.py``: the agents' device-memory metrics against the device."""
    env = dict(os.environ, FAILSOFT_TEST_ZOO=str(ctx.work / "zoo-tests"))
    files = ["tests/runtime/test_gpu_placement.py", "tests/runtime/test_devices.py"]
    files.append("tests/runtime/test_agent_metrics.py")  # the agents' device-memory figures
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    proc = subprocess.run(
        cmd, cwd=ctx.repo, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.strip()), "")
    out: dict[str, Any] = {"exit": proc.returncode, "summary": summary, "defects": []}
    if proc.returncode != 0:
        out["defects"].append(f"pytest exited {proc.returncode}: {summary}")
        out["output_tail"] = proc.stdout[-3000:]
    return out


CHECKS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "environment": environment,
    "placement": placement,
    "memory": memory,
    "faillite": faillite,
    "restart": restart,
    "lumen": lumen,
    "parm": parm,
    "tests": tests,
}


def run_one(name: str, ctx: Ctx, out: Path) -> None:
    """The child process's whole job: one check, its JSON to ``out``."""
    started = time.perf_counter()
    result = CHECKS[name](ctx)
    result["seconds"] = round(time.perf_counter() - started, 2)
    out.write_text(json.dumps(result, default=str))


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
