"""A user's stateful handler as a HAMS graph node on a real cluster: its primary killed, its backup
promoted, and every answer equal to a failure-free run's.

The user's models are ``python``-format handlers added with ``failsoft zoo add`` into a temporary
repository, as a user would: ``clusters/kmeans`` is
:class:`~failsoft.zoo.formats.examples.OnlineKMeans` (online k-means: each request moves a
centroid, so the centroids are state) and ``mlp/python`` is
:class:`~failsoft.zoo.formats.examples.MlpHandler` (stateless). The graph is the one docs/hams.md
serves, ``examples/byom/graph.yaml``: ``cluster -> classify``, ``cluster`` stateful (its primary on
s1, a backup the gateway places on another server and ships the state to), ``classify`` a
stateless node on s2. s1 is killed in the middle of the run. The
reference is the same two handlers run here, in this process, from their initial state: the run's
answers must be bit-equal to it, before and after the failover; a run that lost the centroids at
the kill answers otherwise, which the test checks too (so a lost state could not pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from failsoft.client import Client
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.profiler import QUICK
from tests.runtime.conftest import wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
REQUESTS, KILL_AFTER = 30, 12
GRAPH_YAML = Path(__file__).resolve().parents[2] / "examples" / "byom" / "graph.yaml"
NODES = {"cluster": ("clusters", "kmeans", "s1"), "classify": ("mlp", "python", "s2")}


@pytest.fixture(scope="module")
def user_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """Both handlers added with ``zoo add`` (quick profile) into a fresh repository."""
    from safetensors.numpy import save_file

    out = tmp_path_factory.mktemp("user-stateful")
    repo = ModelRepository(out / "zoo")
    kmeans = examples.kmeans_artefact(out / "kmeans.safetensors")
    save_file(examples.mlp_weights(), str(out / "mlp.safetensors"))
    handler = "failsoft.zoo.formats.examples:"
    add_variant(
        repo, AddRequest("clusters", "kmeans", kmeans, accuracy=0.5, handler=handler + "OnlineKMeans"), QUICK
    )
    add_variant(
        repo,
        AddRequest("mlp", "python", out / "mlp.safetensors", accuracy=0.9, handler=handler + "MlpHandler"),
        QUICK,
    )
    return repo


def graph_config(repo: ModelRepository, state_dir: str) -> Any:
    """``examples/byom/graph.yaml`` (what docs/hams.md serves), on the test's repository and state
    directory, any free port, and servers sized to the measured profiles."""
    data = yaml.safe_load(GRAPH_YAML.read_text())
    families = {f.name: f for f in repo.families()}
    memory = max(6 * max(families[f].variant(v).memory_mb for f, v, _ in NODES.values()), 64.0)
    for server in data["servers"]:
        server["memory_mb"] = round(max(server["memory_mb"], memory), 3)
    homes = {a["name"]: a["primary"]["server"] for a in data["apps"]}
    assert homes == {app: home for app, (_, _, home) in NODES.items()}  # what the test kills
    data |= {"repository": str(repo.root), "gateway": {"port": 0}, "state_dir": state_dir}
    return config_from_dict(data, source=str(GRAPH_YAML))


def reference(
    repo: ModelRepository, inputs: list[np.ndarray], lose_at: int | None = None
) -> list[np.ndarray]:
    """The failure-free run: cluster then classify, each from its initial state, one request at a
    time (``lose_at``: the cluster's state lost before that request, as a restart without a backup)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the agents run (agents.torch_threads)
    try:
        cluster, classify = (repo.load(f, v, "cpu") for f, v, _ in NODES.values())
        out = []
        for i, x in enumerate(inputs):
            if i == lose_at:
                cluster.reset()  # type: ignore[attr-defined]
            out.append(classify.predict(cluster.predict(x)))
        return out
    finally:
        torch.set_num_threads(threads)


def replication(client: Client) -> dict[str, Any]:
    (index,) = [e for e in client.repository_index() if e["name"] == "online"]
    return dict(index["replication"]["nodes"]["cluster"])


def test_a_killed_primary_of_a_users_stateful_handler_is_replaced_by_its_backup_and_answers_stay_exact(
    user_zoo, tmp_path
):
    config = graph_config(user_zoo, str(tmp_path / "state"))
    rng = np.random.default_rng(11)
    inputs = [rng.normal(0, 1.5, (1, examples.KMEANS_SIZES[0])).astype(np.float32) for _ in range(REQUESTS)]
    answers: dict[int, np.ndarray] = {}
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
            wait_for(lambda: replication(client)["backup_holds"] is not None, 120.0, "the backup placed", 0.2)
            placed = replication(client)
            assert placed["primary"] == "s1" and placed["backup"] in ("s2", "s3")
            for i, x in enumerate(inputs):
                if i == KILL_AFTER:
                    client.admin("kill", server="s1")
                raw = client.infer("online", x, timeout=20.0)  # a slow machine is no failure here
                answers[int(raw.raw["parameters"]["seq"])] = np.asarray(raw.outputs)
            wait_for(
                lambda: replication(client)["durable"] == REQUESTS, 120.0, "the state durable again", 0.2
            )
            after = replication(client)
        finally:
            client.close()
    print(f"\ncluster: {after}")
    assert sorted(answers) == list(range(1, REQUESTS + 1))  # every request answered, in order
    expected = reference(user_zoo, inputs)
    for seq, got in answers.items():
        np.testing.assert_array_equal(got, expected[seq - 1], err_msg=f"request {seq}")
    lost = reference(user_zoo, inputs, lose_at=KILL_AFTER)
    assert any(
        not np.array_equal(a, b) for a, b in zip(lost[KILL_AFTER:], expected[KILL_AFTER:], strict=True)
    )
    assert after["failovers"] == 1 and after["lost"] == 0 and after["divergent"] == 0
    assert after["primary"] == placed["backup"]  # the backup was promoted
    assert after["backup"] not in (None, after["primary"])  # and a new one placed
