"""``failsoft deploy`` against a real embedded cluster: Ray, a controller, 3 agents, the gateway.

One cluster for the module (SQLite store), changed in place through the admin API while clients in
a process of their own keep asking the apps that stay: an app added, one removed, one moved to
another server and one to another variant, with no failed request; the same config again changes
nothing; configs that cannot be applied are refused whole, nothing changing; a move whose new
variant does not load rolls back; a controller killed after a deploy resumes the deployed config.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from typing import Any

import pytest

from failsoft.errors import InvalidRequestError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadProcess, LoadSpec
from tests.runtime.conftest import deployed, serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


def base_config(repository: str, state_dir: str) -> dict[str, Any]:
    return {
        "name": "deploy-test",
        "repository": repository,
        "servers": [
            {"name": n, "site": s, "memory_mb": 30, "compute": 4.0}
            for n, s in (("s1", "a"), ("s2", "a"), ("s3", "b"))
        ],
        "apps": [
            {
                "name": "keep",
                "family": "digits_mlp",
                "critical": True,
                "primary": {"server": "s1", "variant": "mlp_l"},
            },
            {"name": "mover", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_m"}},
            {"name": "resize", "family": "digits_mlp", "primary": {"server": "s2", "variant": "mlp_l"}},
            {"name": "gone", "family": "digits_mlp", "primary": {"server": "s3", "variant": "mlp_s"}},
        ],
        "failover": {"policy": "faillite", "warm_replicas": 1},
        "gateway": {"port": 0},
        "agents": {"restart": True, "drain_ms": 100},
        "state_dir": state_dir,
        "store": "sqlite",
    }


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    data = base_config(str(tiny_zoo.root), str(tmp_path_factory.mktemp("state")))
    with serving(config_from_dict(data, source="deploy-test")) as (session, client):
        yield session, client, data


def routes(client: Any) -> dict[str, tuple[str, str] | None]:
    return {
        a["name"]: None if a["route"] is None else (a["route"]["server"], a["route"]["variant"])
        for a in client.status()["apps"]
    }


def settled(client: Any) -> dict[str, Any]:
    seen: list[Any] = []

    def check() -> dict[str, Any] | None:
        status = client.status()
        home = all(a["route"] == a["primary"] for a in status["apps"])
        seen[:] = [status["idle"], [(a["name"], a["primary"], a["route"]) for a in status["apps"]]]
        seen.append([(s["name"], s["state"]) for s in status["servers"]])
        return status if home and status["idle"] else None

    try:
        return wait_for(check, 90.0, "every app at home and the controller idle", 0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None


def test_a_changed_config_is_deployed_under_load_with_no_failed_request(cluster):
    session, client, data = cluster
    settled(client)
    new = copy.deepcopy(data)
    apps = {a["name"]: a for a in new["apps"]}
    apps["mover"]["primary"] = {"server": "s3", "variant": "mlp_m"}  # another server
    apps["resize"]["primary"] = {"server": "s2", "variant": "mlp_s"}  # another variant
    del apps["gone"]
    apps["added"] = {
        "name": "added",
        "family": "digits_mlp",
        "primary": {"server": "s2", "variant": "mlp_xs"},
    }
    new["apps"] = list(apps.values())
    shapes = {app: (64,) for app in ("keep", "mover", "resize")}
    traffic = LoadProcess(LoadSpec(session.url, shapes, 0.05, 5.0, 60.0, max_in_flight=4)).start()
    t0 = time.time()
    try:
        wait_for(lambda: len(traffic.samples) >= 30, 60.0, "the clients answered")
        answer = client.deploy(new, "v2.yaml")
        assert answer["changed"] and answer["version"] == 2
        assert sorted(answer["plan"]["moved"]) == ["mover", "resize"]
        assert answer["plan"]["removed"] == ["gone"] and answer["plan"]["added"] == ["added"]
        done = deployed(client, 2)
        t_done = time.time()
        wait_for(
            lambda: client.ready() and client.infer("added", [[0.0] * 64]).server == "s2",
            30.0,
            "added served",
        )
        time.sleep(1.0)
    finally:
        samples = traffic.stop()
    assert done["last"]["rolled_back"] == {} and done["last"]["unserved"] == []
    failed = [(s.app, round(s.sent - t0, 2), s.error) for s in samples if not s.ok]
    assert not failed, f"{len(failed)} of {len(samples)} requests failed: {failed[:5]}"
    after = [s for s in samples if s.sent > t_done + 0.5]
    assert {(s.server, s.variant) for s in after if s.app == "mover"} == {("s3", "mlp_m")}
    assert {(s.server, s.variant) for s in after if s.app == "resize"} == {("s2", "mlp_s")}
    now = routes(client)
    assert "gone" not in now and now["added"] == ("s2", "mlp_xs")
    with pytest.raises(InvalidRequestError, match="unknown app 'gone'"):
        client.infer("gone", [[0.0] * 64])
    events = [e for e in client.recoveries()["events"] if e["timestamp"] >= t0]
    kinds = [(e["type"], e.get("app"), e.get("phase") or e.get("action")) for e in events]
    assert ("deploy", None, "started") in kinds and ("deploy", None, "done") in kinds
    assert ("deploy", "added", "added") in kinds and ("deploy", "gone", "removed") in kinds
    assert {e["app"] for e in events if e["type"] == "rollout"} == {"mover", "resize"}
    status = client.status()
    assert status["config"]["version"] == 2
    print(f"deploy under load: {len(samples)} requests, 0 failed; done in {(t_done - t0):.2f} s")

    # the same config again: nothing changes
    again = client.deploy(new, "v2.yaml")
    assert not again["changed"] and again["plan"]["empty"] and again["version"] == 2
    cluster[2].clear()
    cluster[2].update(new)


def _unknown_family(d: dict[str, Any]) -> None:
    d["apps"][0]["family"] = "nope"


def _another_server(d: dict[str, Any]) -> None:
    d["servers"].append({"name": "s9", "site": "c", "memory_mb": 10})


def _all_on_s3(d: dict[str, Any]) -> None:
    for app in d["apps"][:3]:
        app["primary"] = {"server": "s3", "variant": "mlp_l"}


def _mode_change(d: dict[str, Any]) -> None:
    d.setdefault("services", []).append({"name": "grp", "mode": "slo", "members": ["keep", "mover"]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_unknown_family, "family 'nope'"),
        (_another_server, "servers change only"),
        (_all_on_s3, "does not fit"),
        (_mode_change, "changes mode"),
    ],
    ids=["unknown-family", "servers", "memory", "mode"],
)
def test_a_config_that_cannot_be_applied_is_refused_whole_and_nothing_changes(cluster, change, message):
    _, client, data = cluster
    settled(client)
    before, version = routes(client), client.deploy_status()["version"]
    bad = copy.deepcopy(data)
    change(bad)
    with pytest.raises(InvalidRequestError, match=message):
        client.deploy(bad, "bad.yaml")
    assert routes(client) == before and client.deploy_status()["version"] == version


def test_a_move_whose_new_variant_does_not_load_rolls_back_with_no_failed_request(cluster):
    session, client, data = cluster
    settled(client)
    version = client.deploy_status()["version"]
    new = copy.deepcopy(data)
    target = next(a for a in new["apps"] if a["name"] == "keep")
    target["primary"] = {"server": "s3", "variant": "mlp_s"}
    client.admin("slow", server="s3", ms=0, load_ms=800)  # the load is slow: break s3 meanwhile
    shapes = {"keep": (64,)}
    traffic = LoadProcess(LoadSpec(session.url, shapes, 0.05, 5.0, 60.0, max_in_flight=4)).start()
    try:
        wait_for(lambda: len(traffic.samples) >= 20, 60.0, "the clients answered")
        client.deploy(new, "v3.yaml")
        s3 = session.agents["s3"].info_sync()["pid"]
        os.kill(s3, signal.SIGKILL)  # the new home's server dies in the middle of the move
        done = deployed(client, version + 1)
        time.sleep(1.0)
    finally:
        samples = traffic.stop()
    assert "keep" in done["last"]["rolled_back"], done
    failed = [(s.app, s.error) for s in samples if not s.ok]
    assert not failed, f"{len(failed)} of {len(samples)} requests failed: {failed[:5]}"
    assert {s.server for s in samples} == {"s1"}
    status = settled(client)
    keep = next(a for a in status["apps"] if a["name"] == "keep")
    assert keep["primary"] == {"server": "s1", "variant": "mlp_l"}
    rollbacks = [e for e in client.recoveries()["events"] if e["type"] == "rollback"]
    assert rollbacks and rollbacks[-1]["app"] == "keep"


def test_a_restarted_controller_resumes_the_deployed_config_not_the_first(cluster):
    session, client, data = cluster
    status = settled(client)
    version = status["config"]["version"]
    assert version >= 2
    apps = {a["name"]: a["primary"] for a in status["apps"]}
    old = session.controller.info_sync()
    os.kill(old["pid"], signal.SIGKILL)

    def resumed() -> dict[str, Any] | None:
        try:
            now = session.controller.info_sync(timeout_s=2.0)
        except Exception:
            return None
        return now if now["pid"] != old["pid"] and now["ready"] else None

    wait_for(resumed, 60.0, "the controller restarted by Ray, ready")
    after = settled(client)
    assert after["config"]["version"] == version
    assert {a["name"]: a["primary"] for a in after["apps"]} == apps
    again = client.deploy(data, "same.yaml")
    assert not again["changed"], again["plan"]


def test_the_deploy_command_prints_the_plan_and_a_second_run_changes_nothing(cluster, tmp_path, capsys):
    import yaml

    from failsoft.cli import main

    _, client, data = cluster
    settled(client)
    version = client.deploy_status()["version"]
    new = copy.deepcopy(data)
    new["apps"][0]["rate_rps"] = 3.0  # a setting changed in place: no load, no move
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(new))
    assert main(["deploy", str(path), "--dry-run"]) == 0  # the plan, and nothing changes
    assert capsys.readouterr().out.startswith("would change")
    assert client.deploy_status()["version"] == version
    assert main(["deploy", str(path)]) == 0  # the gateway found through the config's state_dir
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == f"config version {version + 1}:" and f"  change {new['apps'][0]['name']}: settings" in out
    )
    assert main(["deploy", str(path), "--json"]) == 0
    assert '"changed": false' in capsys.readouterr().out
    assert main(["status", "--state-dir", data["state_dir"]]) == 0
    assert f"config v{version + 1}" in capsys.readouterr().out
    path.write_text("apps: [")
    assert main(["deploy", str(path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    cluster[2].clear()
    cluster[2].update(new)
