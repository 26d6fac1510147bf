"""A real embedded cluster: Ray, a controller, 4 agents with real digits models, the HTTP gateway.

One cluster for the whole module (state store: a real redis-server), driven through the public
surfaces only (HTTP, the SDK, the admin API). The tests run in order, each leaving the cluster
healthy for the next; each waits for a healthy cluster first and causes what it checks itself, so
any one runs alone: deploy, bad requests, a crash under load, a crashed server coming back, a hung
agent, controller restarts under load (plain, and while the store does not answer), an injected
slowdown, a broken server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from failsoft.client import Client
from failsoft.errors import ServerUnavailableError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadProcess, LoadSpec, LoadThread
from failsoft.runtime.session import Session
from failsoft.zoo.digits import load_digits_split
from tests.runtime.conftest import serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
APPS = ("crit-1", "best-1", "crit-2", "best-2", "best-3")


@pytest.fixture(scope="module")
def cluster(tiny_zoo, redis_url, tmp_path_factory):
    family = {f.name: f for f in tiny_zoo.families()}["digits_mlp"]
    large, small = family.variant("mlp_l").memory_mb, family.smallest.memory_mb
    memory = round(2 * large + 1.5 * small, 3)  # two full-size apps, and room for a small first variant
    servers = [("s1", "a"), ("s2", "a"), ("s3", "b"), ("s4", "b")]
    homes = {"crit-1": "s1", "best-1": "s1", "crit-2": "s3", "best-2": "s2", "best-3": "s4"}
    config = config_from_dict(
        {
            "name": "runtime-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": s, "memory_mb": memory, "compute": 4.0} for n, s in servers],
            "apps": [
                {
                    "name": app,
                    "family": "digits_mlp",
                    "critical": app.startswith("crit"),
                    "rate_rps": 2,
                    "primary": {"server": home, "variant": "mlp_l"},
                }
                for app, home in homes.items()
            ],
            "failover": {"policy": "faillite", "alpha": 0.1},
            "gateway": {"port": 0, "max_body_mb": 0.05},
            "agents": {"restart": True, "drain_ms": 100},
            "state_dir": str(tmp_path_factory.mktemp("state")),
            "store": redis_url,
        },
        source="test",
    )
    with serving(config) as running:
        yield running


def stable(client: Client) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = client.status()
        home = all(a["route"] == a["primary"] for a in status["apps"])
        warm = all(w["state"] == "warm" for a in status["apps"] for w in a["warm_backups"])
        critical_covered = all(a["warm_backups"] for a in status["apps"] if a["critical"])
        up = all(s["state"] == "up" for s in status["servers"])
        # idle: no warm re-plan pending either (one is due 3 s after a restore, or a resume)
        return status if home and warm and up and critical_covered and status["idle"] else None

    return wait_for(check, 90.0, "every app at home, every server up, warm backups loaded, idle", 0.2)


def events_since(client: Client, t: float) -> list[dict[str, Any]]:
    return [e for e in client.recoveries()["events"] if e["timestamp"] >= t]


def load(session: Session, seconds: float, period_s: float = 0.05, deadline_s: float = 15.0) -> LoadThread:
    """Client load on every app; ``deadline_s`` is each request's deadline (``parameters.timeout``)."""
    shapes = {app: (64,) for app in APPS}
    return LoadThread(LoadSpec(session.url, shapes, period_s, deadline_s, seconds, max_in_flight=4)).start()


def test_deploy_places_primaries_and_warm_backups_and_serves_real_models(cluster):
    session, client = cluster
    status = stable(client)
    for app in status["apps"]:
        if app["critical"]:
            (backup,) = app["warm_backups"]
            assert backup["server"] != app["primary"]["server"]
    assert client.ready()
    for agent in session.agents.values():  # one torch thread each, at the niceness of a server
        info = agent.info_sync()
        assert (info["torch_threads"], info["nice"]) == (1, 0)
    meta = client.model("crit-1")
    assert meta["inputs"][0]["shape"] == [-1, 64] and meta["outputs"][0]["shape"] == [-1, 10]
    assert all(m["state"] == "READY" for m in client.repository_index())
    split = load_digits_split()
    result = client.infer("crit-1", split.x_test[:64])
    assert (result.server, result.variant, result.degraded, result.reconstructed) == (
        "s1",
        "mlp_l",
        False,
        False,
    )
    assert np.mean(result.predictions == split.y_test[:64]) > 0.85  # the real trained model answers


def test_bad_requests_get_a_4xx_with_a_reason_and_the_gateway_keeps_serving(cluster):
    session, client = cluster
    stable(client)  # crit-1 at home on s1
    url, admin = session.url, session.admin_url
    good = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
    cases = [
        (httpx.post(f"{url}/v2/models/nope/infer", json=good), 404, "unknown app 'nope'"),
        (httpx.post(f"{url}/v2/models/crit-1/infer", content=b"{oops"), 400, "malformed JSON"),
        (
            httpx.post(
                f"{url}/v2/models/crit-1/infer", json={"inputs": [{**good["inputs"][0], "shape": [1, 63]}]}
            ),
            400,
            "does not match",
        ),
        (
            httpx.post(
                f"{url}/v2/models/crit-1/infer", json={"inputs": [{**good["inputs"][0], "datatype": "BYTES"}]}
            ),
            400,
            "datatype",
        ),
        (httpx.post(f"{url}/v2/models/crit-1/infer", content=b"x" * 200_000), 413, "exceeds the limit"),
        (httpx.get(f"{admin}/admin/status"), 401, "Bearer"),
        (httpx.get(f"{admin}/admin/status", headers={"Authorization": "Bearer wrong"}), 401, "Bearer"),
        (
            httpx.post(f"{admin}/admin/chaos/kill", json={"server": "s9"}, headers=_auth(client)),
            404,
            "unknown server",
        ),
        (httpx.get(f"{url}/admin/status", headers=_auth(client)), 404, "Not Found"),  # the admin plane's
        (httpx.get(f"{url}/v2/nothing-here"), 404, "Not Found"),
    ]
    for response, status, says in cases:
        assert response.status_code == status, response.text
        assert says in response.json()["error"]
    ok = httpx.post(f"{url}/v2/models/crit-1/infer", json=good)
    assert ok.status_code == 200 and ok.json()["parameters"]["server"] == "s1"


def _auth(client: Client) -> dict[str, str]:
    assert client._admin is not None  # the token goes to the admin plane only
    assert "Authorization" not in client._http.headers
    return {"Authorization": client._admin.headers["Authorization"]}


def test_a_server_killed_under_load_every_app_recovers_and_critical_clients_see_no_error(cluster):
    session, client = cluster
    stable(client)
    heard: list[dict[str, Any]] = []
    threading.Thread(target=_listen, args=(client, heard), daemon=True).start()
    # loads take 1 s more: the small variant serves a while (with 300 ms it served ~0.4 s, and under
    # two CPU hogs the clients, in this process with the gateway, once saw none of it)
    for server in ("s2", "s3", "s4"):
        client.admin("slow", server=server, ms=0, load_ms=1000)
    traffic = load(session, 30.0)
    time.sleep(1.5)
    killed = client.admin("kill", server="s1")["killed"][0]
    t_kill = killed["at"]

    def recovered() -> bool:
        done = {r["app"] for r in client.recoveries()["recoveries"] if r["detected_at"] >= t_kill}
        upgraded = any(e["type"] == "upgrade" and e["app"] == "best-1" for e in events_since(client, t_kill))
        return {"crit-1", "best-1"} <= done and upgraded

    wait_for(recovered, 20.0, "crit-1 and best-1 answering on new routes, best-1 upgraded", 0.1)
    time.sleep(1.0)
    samples = traffic.stop()
    for server in ("s2", "s3", "s4"):
        client.admin("slow", server=server, ms=0, load_ms=0)
    events = events_since(client, t_kill)

    failures = {e["app"]: e for e in events if e["type"] == "failure" and e["server"] == "s1"}
    assert set(failures) == {"crit-1", "best-1"}
    detection_ms = (failures["crit-1"]["detected_at"] - t_kill) * 1000
    assert 0 < detection_ms < 1000
    failovers = {e["app"]: e for e in events if e["type"] == "failover"}
    spurious = [e for e in events if e["type"] == "failure" and e["server"] != "s1"]
    assert not spurious, f"servers declared failed that were not killed: {spurious}"
    assert failovers["crit-1"]["kind"] == "warm", failovers["crit-1"]
    assert failovers["best-1"]["kind"] == "progressive"
    small, large = failovers["best-1"]["variant"], failovers["best-1"]["final_variant"]
    assert small != large == "mlp_l"  # progressive: a small variant first, the primary's size later

    after = [s for s in samples if s.sent >= t_kill]
    for app in ("crit-1", "crit-2"):
        mine = [s for s in after if s.app == app]
        assert mine and all(s.ok for s in mine), [s.error for s in mine if not s.ok][:3]
    served = [s.variant for s in sorted(after, key=lambda s: s.done) if s.app == "best-1" and s.ok]
    assert small in served and large in served
    assert served.index(small) < served.index(large)  # the small variant answered before the large one
    assert all(s.ok for s in samples), [s.error for s in samples if not s.ok][:3]

    kinds = {e["type"] for e in heard}
    assert {"failure", "failover", "upgrade"} <= kinds  # pushed to websocket subscribers
    metrics = httpx.get(f"{session.url}/metrics").text
    assert 'failsoft_failovers_total{app="crit-1",kind="warm"} 1.0' in metrics
    assert "failsoft_mttr_seconds_count" in metrics
    assert 'failsoft_server_failures_total{server="s1"} 1.0' in metrics


def _listen(client: Client, heard: list[dict[str, Any]]) -> None:
    """Subscribe to /v2/events until the gateway goes away (end of the module)."""
    with contextlib.suppress(ServerUnavailableError):
        for event in client.events():
            heard.append(event)


def test_a_killed_server_that_comes_back_gets_its_primaries_and_warm_backups_are_replanned(cluster):
    _, client = cluster
    stable(client)
    t_kill = client.admin("kill", server="s1")["killed"][0]["at"]
    wait_for(
        lambda: (
            {e["app"] for e in events_since(client, t_kill) if e["type"] == "restore"} >= {"crit-1", "best-1"}
        ),
        90.0,
        "crit-1 and best-1 restored on s1 (Ray restarts the killed agent)",
        0.2,
    )
    status = stable(client)  # warm backups re-planned and loaded again
    routes = {a["name"]: a["route"]["server"] for a in status["apps"]}
    assert routes["crit-1"] == routes["best-1"] == "s1"
    events = events_since(client, t_kill)
    up = next(e for e in events if e["type"] == "server_up" and e["server"] == "s1")
    restores = [e for e in events if e["type"] == "restore" and e["server"] == "s1"]
    assert all(e["timestamp"] >= up["timestamp"] for e in restores)  # restored once it was up again


def test_a_hung_agent_is_detected_and_comes_back_without_reloading(cluster):
    session, client = cluster
    stable(client)
    traffic = load(session, 20.0, period_s=0.1)
    time.sleep(0.5)
    hung = client.admin("hang", server="s2")
    try:
        wait_for(
            lambda: any(
                e["type"] == "failover" and e["app"] == "best-2" for e in events_since(client, hung["at"])
            ),
            10.0,
            "best-2 failed over away from the hung s2",
        )
    finally:
        client.admin("resume", server="s2")
    restore = wait_for(
        lambda: next(
            (e for e in events_since(client, hung["at"]) if e["type"] == "restore" and e["app"] == "best-2"),
            None,
        ),
        30.0,
        "best-2 restored on s2",
    )
    assert restore["reloaded"] is False  # the hung process kept its models: nothing to load again
    events = events_since(client, hung["at"])
    failure = next(e for e in events if e["type"] == "failure" and e["server"] == "s2")
    back = next(e for e in events if e["type"] == "server_up" and e["server"] == "s2")
    silent_s = back["heard_again_at"] - failure["last_heartbeat_at"]
    assert silent_s > failure["detected_at"] - failure["last_heartbeat_at"]  # silent past detection
    samples = traffic.stop()
    assert all(s.ok for s in samples if s.app == "best-2"), "requests to the hung server were retried"


def test_a_controller_restart_under_load_fails_no_2s_request_and_reloads_nothing(cluster):
    """Issue 10's target, live: during a controller restart under load, no request with a 2 s
    deadline fails. The gateway keeps routing on the table it mirrors while the controller is dead
    and while the restarted one resumes, and stays ready throughout (an empty table mirrored from
    a controller still resuming once made it unready and stalled routing for ~10 s); then it takes
    the new controller's table. The new controller reloads nothing and declares no server failed."""
    _restart_under_load(*cluster)


def test_a_controller_restart_while_the_store_does_not_answer_keeps_serving_then_resumes(
    cluster, redis_server
):
    """The store (Redis) stops answering, then the controller dies: Ray restarts it, and it cannot
    read its state for longer than the store client's timeouts (5 s) and the gateway's long-poll
    (10 s). The gateway must keep serving on its last table all along (the agents are fine), and the
    controller must resume once the store answers again."""
    _restart_under_load(*cluster, store_pid=redis_server.pid)


def _restart_under_load(session: Session, client: Client, store_pid: int | None = None) -> None:
    """SIGKILL the controller under load (2 s deadlines); with ``store_pid``, stop the store first
    and continue it only once the restarted controller has waited for it for 11 s."""
    before = stable(client)
    routes = {a["name"]: a["route"]["server"] for a in before["apps"]}
    loads = {name: agent.holdings_sync()["loads_total"] for name, agent in session.agents.items()}
    watch = _ReadinessWatch(session.url).start()
    # the clients in a process of their own: in this one they would share the interpreter with the
    # gateway, the probes and the test, and their latencies would be this process's queueing
    shapes = {app: (64,) for app in APPS}
    traffic = LoadProcess(LoadSpec(session.url, shapes, 0.1, 2.0, 90.0, max_in_flight=4)).start()
    try:
        wait_for(lambda: len(traffic.samples) >= 20, 60.0, "the clients answered")
        old = session.controller.info_sync()
        if store_pid is not None:
            os.kill(store_pid, signal.SIGSTOP)
        t_kill = time.time()
        try:
            os.kill(old["pid"], signal.SIGKILL)
            if store_pid is not None:
                up = wait_for(lambda: _restarted(session, old["pid"]), 60.0, "the controller restarted")
                time.sleep(11.0)  # past the gateway's 10 s long-poll: answered while not ready
                assert not up["ready"] and not session.controller.info_sync()["ready"]  # it waited
        finally:
            if store_pid is not None:
                os.kill(store_pid, signal.SIGCONT)
        store_away_s = time.time() - t_kill if store_pid is not None else 0.0
        new = wait_for(lambda: _resumed(session, old["pid"]), 60.0, "the controller restarted by Ray, ready")
        t_ready = time.time()
        wait_for(
            lambda: _gateway_mirrors(client, new["epoch"]), 30.0, "the gateway on the new controller's table"
        )
        t_mirrored = time.time()
        time.sleep(1.0)
    finally:
        samples = traffic.stop()
        watch.stop()
    after = stable(client)

    assert new["epoch"] != old["epoch"]  # a new incarnation's table, which the gateway now mirrors
    failed = [(s.app, round(s.sent - t_kill, 2), s.error) for s in samples if not s.ok]
    assert not failed, f"{len(failed)} of {len(samples)} requests failed: {failed[:5]}"
    slow = [(s.app, round(s.sent - t_kill, 2), round(s.latency_ms)) for s in samples if s.latency_ms >= 2000]
    assert not slow, f"answered, but past the clients' 2 s: {slow[:5]}"
    # routing kept working through the window, each app on the route it had before, never 2 s (a
    # request's whole deadline) without an answer
    window = [s for s in samples if t_kill <= s.sent and s.done <= t_mirrored]
    for app, server in routes.items():
        mine = [s for s in window if s.app == app]
        assert mine, (app, round(t_mirrored - t_kill, 2))
        assert {s.server for s in mine} == {server}, (app, {s.server for s in mine})
        done = [t_kill, *sorted(s.done for s in mine), t_mirrored]
        gap = max(b - a for a, b in itertools.pairwise(done))
        assert gap < 2.0, (app, round(gap, 2))
    # and the gateway stayed ready, every app READY, all along (probed every 25 ms)
    probes = [p for p in watch.probes if t_kill <= p[0] <= t_mirrored + 1.0]
    assert len(probes) >= 10, len(probes)
    unready = [(round(t - t_kill, 3), what) for t, what in probes if what]
    assert not unready, f"the gateway was not ready during the restart: {unready[:5]}"
    alarms = [e for e in events_since(client, t_kill) if e["type"] == "failure"]
    assert not alarms, f"a server declared failed across the controller's restart: {alarms}"
    assert _routes(after) == _routes(before)
    assert {name: agent.holdings_sync()["loads_total"] for name, agent in session.agents.items()} == loads
    print(
        f"controller restart (store away {store_away_s:.1f} s): ready {t_ready - t_kill:.2f} s after the "
        f"kill, the gateway on its table {t_mirrored - t_kill:.2f} s; {len(window)} answers in that "
        f"window, {len(samples)} in all (slowest {max(s.latency_ms for s in samples):.0f} ms), "
        f"{len(probes)} readiness probes"
    )


def _restarted(session: Session, old_pid: int) -> dict[str, Any] | None:
    try:
        now = session.controller.info_sync(timeout_s=2.0)
    except Exception:
        return None
    return now if now["pid"] != old_pid and now["restarted"] else None


def _resumed(session: Session, old_pid: int) -> dict[str, Any] | None:
    now = _restarted(session, old_pid)
    return now if now is not None and now["ready"] else None


def _gateway_mirrors(client: Client, epoch: str) -> bool:
    """The gateway mirrors the table of epoch ``epoch`` and hears the controller on every stream."""
    gateway = client.status()["gateway"]
    return bool(gateway["route_epoch"] == epoch and gateway["connected"])


class _ReadinessWatch:
    """Probes the gateway every 25 ms: ``/v2/health/ready`` and every app's state in the index."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.probes: list[tuple[float, str]] = []  # (wall time, what was not ready; "" if all was)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readiness-watch", daemon=True)

    def start(self) -> _ReadinessWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while not self._stop.is_set():
                t = time.time()
                with contextlib.suppress(httpx.HTTPError):
                    health = http.get("/v2/health/ready")
                    index = http.post("/v2/repository/index", json={}).json()
                    down = [m["name"] for m in index if m["state"] != "READY"]
                    what = ("gateway unready " if health.status_code != 200 else "") + " ".join(down)
                    self.probes.append((t, what))
                self._stop.wait(0.025)


def _routes(status: dict[str, Any]) -> str:
    return json.dumps(
        {a["name"]: [a["route"], sorted(json.dumps(w) for w in a["warm_backups"])] for a in status["apps"]},
        sort_keys=True,
    )


def test_an_injected_slowdown_slows_that_server_only(cluster):
    _, client = cluster
    stable(client)
    client.admin("slow", server="s3", ms=150)
    try:
        slow = client.infer("crit-2", np.zeros(64, dtype=np.float32))
        fast = client.infer("best-3", np.zeros(64, dtype=np.float32))
    finally:
        client.admin("slow", server="s3", ms=0)
    assert slow.server == "s3" and slow.latency_ms >= 150
    assert fast.server == "s4" and fast.latency_ms < 150


def test_a_server_that_heartbeats_but_fails_every_inference_is_failed_over(cluster):
    from failsoft.errors import FailsoftError

    _, client = cluster
    stable(client)
    start = time.time()
    client.admin("break", server="s4", broken=True)
    errors, moved = 0, None
    try:
        while moved is None and time.time() < start + 30.0:
            try:
                answer = client.infer("best-3", np.zeros(64, dtype=np.float32))
            except FailsoftError:
                errors += 1
                continue
            if answer.server != "s4":
                moved = answer
    finally:
        client.admin("break", server="s4", broken=False)
    assert moved is not None, f"best-3 was never served elsewhere ({errors} errors in 30 s)"
    assert errors >= 1, errors  # clients saw the fault (its end is bounded by the 30 s window above)
    failed = [e for e in events_since(client, start) if e["type"] == "failure" and e.get("server") == "s4"]
    assert failed, "s4 was never declared failed"
    s4 = next(s for s in client.status()["servers"] if s["name"] == "s4")
    assert s4["state"] != "up"  # quarantined: its heartbeats alone do not bring it back at once
