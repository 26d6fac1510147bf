"""``failsoft bench partition CONFIG``: a server cut off from the network under load, then healed.

The benchmark builds the cluster an operator would build from separate machines, on this host
(:mod:`failsoft.runtime.netcluster`: one network namespace for the Ray head and ``failsoft serve``,
one per server, clients on the host), drives every app with a steady load from the host, takes
one server's link down (its processes keep running: a site that lost its uplink), holds the
partition, brings the link up again, and waits for the server to rejoin and its apps to return
home. Everything it made (namespaces, links, processes) is removed at the end, whatever happened.

Every request is accounted for in the JSON:

* ``detection_ms``: link down to the controller's verdict (the ``failure`` event's ``detected_at``);
* ``failed_requests``: requests that got an error (a request in flight on the partitioned server
  when its route moved is retried by the gateway on the new route, within its deadline);
* ``answered_by_fenced_server``: answers received from the partitioned server between the
  controller's verdict and the first route back to it (``restore``); the guarantee is that there
  are none once the gateway has learned of the verdict (its fence), and this counts from the
  verdict itself, so it is stricter than the guarantee;
* ``recovery_rate``: the share of the partitioned server's apps served elsewhere during the partition;
* ``healed_rejoined``: after the heal the server was heard again (``server_up``), every app is back
  at home, and the server's agent restarted at most once (``agent_restarts``: no restart storm). A
  partition shorter than Ray's node timeout (about 65 s with Ray's defaults) keeps the same
  agent (0 restarts); a longer one makes Ray declare the node dead, its raylet exits when it
  reaches the head again, starts afresh (its supervisor), and Ray restarts the agent there (1);
* ``heal_ms``: link up to every app at home again.

``--fault kill`` kills every process of the server's node instead (the machine loses power) and
starts its Ray node again at the "heal" (it boots): Ray restarts the agent there, once.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from failsoft.errors import ConfigError, FailsoftError
from failsoft.runtime.config import load_config

Progress = Callable[[str], None]
FAULTS = ("partition", "kill")


@dataclass(frozen=True)
class PartitionSettings:
    server: str | None = None  # the server to partition (default: the one with the most primaries)
    partition_s: float = 5.0
    rate_rps: float = 20.0  # the load, over all apps
    settle_s: float = 3.0  # load before the partition and after the apps are home again
    timeout_s: float = 120.0  # for each wait (start excluded)
    subnet: str = "10.77.0"
    logs: Path | None = None  # keep the processes' and Ray's logs here
    fault: str = "partition"  # or "kill": every process of the server's node killed, restarted at the heal


@dataclass
class Record:
    app: str
    sent: float
    received: float
    server: str | None
    error: str | None = None


@dataclass
class Load:
    """Requests at ``rate_rps`` round-robin over the apps, from the host, in a few threads."""

    client_factory: Callable[[], Any]
    apps: list[str]
    inputs: dict[str, np.ndarray]
    rate_rps: float
    records: list[Record] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, threads: int = 4) -> None:
        for i in range(threads):
            t = threading.Thread(target=self._run, args=(i, threads), daemon=True, name=f"load-{i}")
            t.start()
            self._threads.append(t)

    def _run(self, index: int, threads: int) -> None:
        period = threads / self.rate_rps
        n = index
        with self.client_factory() as client:
            next_at = time.time() + index * period / threads
            while not self._stop.is_set():
                app = self.apps[n % len(self.apps)]
                n += threads
                sent = time.time()
                try:
                    answer = client.infer(app, self.inputs[app], timeout=3.0)
                    self.records.append(Record(app, sent, time.time(), answer.server))
                except Exception as exc:  # every failure is a record, of any kind
                    self.records.append(Record(app, sent, time.time(), None, f"{type(exc).__name__}: {exc}"))
                next_at += period
                self._stop.wait(max(0.0, next_at - time.time()))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def run(config_path: Path, settings: PartitionSettings, progress: Progress | None = None) -> dict[str, Any]:
    from failsoft.runtime.netcluster import NetCluster
    from failsoft.runtime.netns import unsupported_reason

    say = progress or (lambda _: None)
    reason = unsupported_reason()
    if reason is not None:
        raise ConfigError(f"bench partition needs network namespaces: {reason}")
    config = load_config(config_path)
    servers = [s.name for s in config.servers]
    homes = {a.name: a.server for a in config.apps}  # None: placed at deploy
    target = settings.server or max(servers, key=lambda s: sum(h == s for h in homes.values()))
    if settings.fault not in FAULTS:
        raise ConfigError(f"fault {settings.fault!r}: expected one of {', '.join(FAULTS)}")
    if target not in servers:
        raise ConfigError(f"--server {target!r}: not a server of {config_path} ({', '.join(servers)})")
    with tempfile.TemporaryDirectory(prefix="failsoft-partition-") as tmp:
        work = Path(tmp)
        state = work / "state" / config.name
        derived = _derived_config(config_path, config, state, work)
        with NetCluster(derived, servers, work, subnet=settings.subnet) as cluster:
            cluster.keep_logs = settings.logs
            say(f"starting Ray and failsoft in {len(servers) + 1} network namespaces ...")
            t0 = time.time()
            cluster.start(state, timeout_s=max(settings.timeout_s, 300.0))
            started_s = time.time() - t0
            with cluster.client(state) as client:
                _wait(lambda: _home(client), settings.timeout_s, "every app at home")
                restarts0 = _restarts(client, target)
                inputs = _inputs(client, list(homes))
                load = Load(lambda: cluster.client(state), list(homes), inputs, settings.rate_rps)
                load.start()
                try:
                    result = _partition_and_heal(cluster, client, target, settings, say)
                finally:
                    load.stop()
                restarts = _restarts(client, target) - restarts0
        accounted = _account(load.records, target, result)
        # no restart storm: the agent restarts at most once (a killed node's; a partition longer
        # than Ray's node timeout, whose raylet Ray declared dead and which starts afresh)
        result["healed_rejoined"] = bool(result.pop("rejoined") and restarts <= 1)
        return {
            "config": str(config_path),
            "fault": settings.fault,
            "server": target,
            "servers": servers,
            "apps_on_server": sorted(a for a, h in homes.items() if h == target),
            "partition_s": settings.partition_s,
            "rate_rps": settings.rate_rps,
            "heartbeat": {
                "interval_ms": config.heartbeat.interval_s * 1000,
                "missed": config.heartbeat.missed_to_fail,
            },
            "start_s": round(started_s, 1),
            "agent_restarts": restarts,
            **result,
            **accounted,
        }


def _partition_and_heal(
    cluster: Any, client: Any, target: str, settings: PartitionSettings, say: Progress
) -> dict[str, Any]:
    time.sleep(settings.settle_s)
    say(f"{settings.fault}: {target} for {settings.partition_s:g} s ...")
    cut = time.time()
    if settings.fault == "kill":
        cluster.lab.kill(target)
    else:
        cluster.lab.partition(target)
    failure = _wait(
        lambda: _event(client, "failure", target, cut), settings.timeout_s, f"{target} declared failed"
    )
    time.sleep(max(0.0, cut + settings.partition_s - time.time()))
    moved = [a["name"] for a in client.status()["apps"] if a["primary"]["server"] == target]
    served = [a for a in client.status()["apps"] if a["name"] in moved and a["route"] is not None]
    healed = time.time()
    if settings.fault == "kill":
        cluster.start_node(target)  # the machine boots again: its Ray node, then Ray restarts the agent
    else:
        cluster.lab.heal(target)
    say(f"healed {target}; waiting for it to rejoin ...")
    up = _wait(
        lambda: _event(client, "server_up", target, healed), settings.timeout_s, f"{target} heard again"
    )
    _wait(lambda: _home(client), settings.timeout_s, "every app at home again")
    home_ms = (time.time() - healed) * 1000
    restored = _event(client, "restore", target, healed)
    time.sleep(settings.settle_s)
    return {
        "detection_ms": round((failure["detected_at"] - cut) * 1000, 1),
        "last_heartbeat_before_cut_ms": round((cut - failure["last_heartbeat_at"]) * 1000, 1),
        "recovery_rate": round(len(served) / len(moved), 3) if moved else 1.0,
        "heal_ms": round(home_ms, 1),
        "rejoin_ms": round((up["timestamp"] - healed) * 1000, 1),
        "rejoined": True,
        "_t": {
            "cut": cut,
            "failed": failure["timestamp"],
            "healed": healed,
            "restored": restored["timestamp"] if restored else time.time(),
        },
    }


def _account(records: list[Record], target: str, result: dict[str, Any]) -> dict[str, Any]:
    t = result.pop("_t")
    answered = [r for r in records if r.error is None]
    failed = [r for r in records if r.error is not None]
    fenced = [r for r in answered if r.server == target and t["failed"] <= r.received < t["restored"]]
    during = [r for r in records if t["cut"] <= r.sent < t["healed"]]
    lat = sorted((r.received - r.sent) * 1000 for r in answered)
    errors: dict[str, int] = {}
    for r in failed:
        kind = (r.error or "").split(":", 1)[0]
        errors[kind] = errors.get(kind, 0) + 1
    return {
        "requests": len(records),
        "answered": len(answered),
        "failed_requests": len(failed),
        "errors": errors,
        "answered_by_fenced_server": len(fenced),
        "requests_during_partition": len(during),
        "failed_during_partition": sum(r.error is not None for r in during),
        "failures": [  # each failed request: when it was sent (seconds from the cut), how long it waited
            {
                "app": r.app,
                "sent_s": round(r.sent - t["cut"], 3),
                "waited_ms": round((r.received - r.sent) * 1000, 1),
                "error": r.error,
            }
            for r in failed[:20]
        ],
        "latency_ms": {
            "p50": round(lat[len(lat) // 2], 1) if lat else None,
            "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1) if lat else None,
            "max": round(lat[-1], 1) if lat else None,
        },
    }


def _derived_config(path: Path, config: Any, state: Path, work: Path) -> Path:
    """The config with its repository made absolute and its state in the benchmark's directory."""
    raw = yaml.safe_load(path.read_text())
    raw.update(repository=str(config.repository), state_dir=str(state), gateway={"port": 0})
    out = work / "config.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def _inputs(client: Any, apps: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for app in apps:
        meta = client.model(app)
        shape = [int(d) for d in meta["inputs"][0]["shape"] if int(d) > 0]
        out[app] = rng.random(shape, dtype=np.float32)
    return out


def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
        except FailsoftError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench partition: not {what} within {timeout_s:g} s")
        time.sleep(0.1)


def _home(client: Any) -> bool:
    status = client.status()
    up = all(s["state"] == "up" for s in status["servers"])
    return up and all(a["route"] == a["primary"] for a in status["apps"])


def _restarts(client: Any, server: str) -> int:
    return int(next(s["restarts"] for s in client.status()["servers"] if s["name"] == server))


def _event(client: Any, kind: str, server: str, since: float) -> dict[str, Any] | None:
    events = client.recoveries()["events"]
    return next(
        (e for e in events if e["type"] == kind and e["server"] == server and e["timestamp"] >= since), None
    )


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)
