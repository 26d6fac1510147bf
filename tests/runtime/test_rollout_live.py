"""Model versions on a real embedded cluster: Triton's layout, load/unload, rolling updates.

A copy of the tiny zoo gets numbered versions of ``mlp_l`` while the cluster serves
(``digits_mlp/mlp_l/2/``, a working copy, and ``/3/``, whose weights are broken); Triton's
repository API on the admin plane rolls an app out to version 2 under load (every answer after the
switch from it, none failed), a broken version 3 is rolled back with no failed request, and an
unloaded app is gone. ``/v2/models/{name}/versions/{v}`` answers for the loaded version only.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import httpx
import pytest

from failsoft.errors import InvalidRequestError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadProcess, LoadSpec
from tests.runtime.conftest import deployed, serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
ROW = [[0.0] * 64]


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo") / "zoo"
    shutil.copytree(tiny_zoo.root, root)
    data = {
        "name": "rollout-test",
        "repository": str(root),
        "servers": [
            {"name": n, "site": s, "memory_mb": 30, "compute": 4.0} for n, s in (("s1", "a"), ("s2", "b"))
        ],
        "apps": [
            {
                "name": "cam",
                "family": "digits_mlp",
                "critical": True,
                "primary": {"server": "s1", "variant": "mlp_l"},
            },
            {"name": "other", "family": "digits_mlp", "primary": {"server": "s2", "variant": "mlp_m"}},
        ],
        "gateway": {"port": 0},
        "agents": {"drain_ms": 100},
        "state_dir": str(tmp_path_factory.mktemp("state")),
    }
    with serving(config_from_dict(data, source="rollout-test")) as (session, client):
        yield session, client, root


def add_version(root: Any, version: int, broken: bool = False) -> None:
    family = root / "digits_mlp"
    target = family / "mlp_l" / str(version)
    shutil.copytree(family / "mlp_l", target, ignore=shutil.ignore_patterns(*"0123456789"))
    if broken:
        (target / "model.safetensors").write_bytes(b"not a safetensors file")


def roll(session: Any, client: Any, version: int) -> tuple[dict[str, Any], list[Any], float]:
    """Roll ``cam`` out to ``version`` under load: the deploy's end state, the samples, its end time."""
    traffic = LoadProcess(LoadSpec(session.url, {"cam": (64,)}, 0.03, 5.0, 60.0, max_in_flight=4)).start()
    try:
        wait_for(lambda: len(traffic.samples) >= 20, 60.0, "the clients answered")
        answer = client.load_model("cam", version)
        assert answer["changed"] and answer["plan"]["moved"] == ["cam"]
        done = deployed(client, answer["version"])
        t_done = time.time()
        time.sleep(1.0)
    finally:
        samples = traffic.stop()
    failed = [(round(s.sent - t_done, 2), s.error) for s in samples if not s.ok]
    assert not failed, f"{len(failed)} of {len(samples)} requests failed: {failed[:5]}"
    return done, samples, t_done


def test_a_new_version_is_rolled_out_under_load_and_only_the_loaded_version_answers(cluster):
    session, client, root = cluster
    add_version(root, 2)
    done, samples, t_done = roll(session, client, 2)
    assert done["last"]["rolled_back"] == {}
    after = [s for s in samples if s.sent > t_done]
    assert after and {s.variant for s in after} == {"mlp_l@2"}
    assert {s.variant for s in samples} <= {"mlp_l", "mlp_l@2"}
    rollouts = [e for e in client.recoveries()["events"] if e["type"] == "rollout"]
    assert rollouts[-1]["app"] == "cam" and rollouts[-1]["variant"] == "mlp_l@2"
    assert rollouts[-1]["previous"] == [{"server": "s1", "variant": "mlp_l"}]
    with httpx.Client(base_url=session.url) as http:
        assert http.get("/v2/models/cam/versions/2").status_code == 200
        assert http.get("/v2/models/cam/versions/2/ready").status_code == 200
        gone = http.get("/v2/models/cam/versions/1")
        assert gone.status_code == 404 and "version 2 is loaded" in gone.json()["error"]
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW[0]}]}
        answer = http.post("/v2/models/cam/versions/2/infer", json=body)
        assert answer.status_code == 200 and answer.json()["parameters"]["variant"] == "mlp_l@2"
        # model control is the admin plane's: the inference plane has no such endpoint
        assert http.post("/v2/repository/models/cam/load", json={}).status_code == 404


def test_a_broken_version_is_rolled_back_with_no_failed_request(cluster):
    session, client, root = cluster
    add_version(root, 3, broken=True)
    done, samples, _ = roll(session, client, 3)
    assert "cam" in done["last"]["rolled_back"]
    assert {s.variant for s in samples} == {"mlp_l@2"}  # the old version answered throughout
    rollbacks = [e for e in client.recoveries()["events"] if e["type"] == "rollback"]
    assert rollbacks[-1]["app"] == "cam" and rollbacks[-1]["variant"] == "mlp_l@2"
    cam = next(a for a in client.status()["apps"] if a["name"] == "cam")
    assert cam["primary"] == {"server": "s1", "variant": "mlp_l@2"} == cam["route"]


def test_an_unknown_version_is_refused_and_an_unloaded_model_is_gone(cluster):
    _, client, _ = cluster
    with pytest.raises(InvalidRequestError, match="no version 9"):
        client.load_model("cam", 9)
    answer = client.unload_model("other")
    assert answer["plan"]["removed"] == ["other"]
    deployed(client, answer["version"])
    with pytest.raises(InvalidRequestError, match="unknown app 'other'"):
        client.infer("other", ROW)
    assert "other" not in {a["name"] for a in client.status()["apps"]}


def test_a_controller_killed_in_the_middle_of_a_rollout_resumes_it(cluster):
    session, client, root = cluster
    add_version(root, 4)
    client.admin("slow", server="s1", ms=0, load_ms=3000)  # the new version's load takes 3 s
    traffic = LoadProcess(LoadSpec(session.url, {"cam": (64,)}, 0.03, 5.0, 90.0, max_in_flight=4)).start()
    try:
        wait_for(lambda: len(traffic.samples) >= 20, 60.0, "the clients answered")
        answer = client.load_model("cam", 4)
        time.sleep(0.5)  # the load is under way; the store has the new deployment
        old = session.controller.info_sync()
        os.kill(old["pid"], signal.SIGKILL)

        def moved() -> bool:
            try:
                status = client.status()
            except Exception:
                return False
            cam = next(a for a in status["apps"] if a["name"] == "cam")
            # the gateway's mirror lags a restarted controller by its reconnect backoff (up to 1 s,
            # docs/runtime.md): "moved" is the controller's route *and* the gateway holding its table
            mirrored = (status["gateway"]["route_epoch"], status["gateway"]["route_version"])
            return cam["route"] == {"server": "s1", "variant": "mlp_l@4"} and mirrored == (
                status["epoch"],
                status["version"],
            )

        wait_for(moved, 90.0, "cam served by version 4 after the controller's restart", 0.2)
        t_done = time.time()
        time.sleep(1.0)
    finally:
        client.admin("slow", server="s1", ms=0, load_ms=0)
        samples = traffic.stop()
    failed = [(round(s.sent - t_done, 2), s.error) for s in samples if not s.ok]
    assert not failed, f"{len(failed)} of {len(samples)} requests failed: {failed[:5]}"
    assert {s.variant for s in samples if s.sent > t_done} == {"mlp_l@4"}
    status = client.status()
    assert status["config"]["version"] == answer["version"] and status["controller"]["restarted"]
    assert next(a for a in status["apps"] if a["name"] == "cam")["primary"]["variant"] == "mlp_l@4"
