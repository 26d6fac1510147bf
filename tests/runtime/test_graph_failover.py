"""A stateful graph node's primary killed on a real cluster (HAMS): its backup is promoted, the
graph goes on, and every answer equals a failure-free run's.

The graph is ``p -> q``, both the SP500 GRU (``sp500_gru/gru_16``: one price in, the next out):
``p`` is stateful (a primary on s1, a backup the gateway places on another server and ships the
state to after every request), ``q`` a stateless node on s2 (its GRU's hidden state moves on too,
which requests sent one at a time keep in ``seq`` order). s1 is killed in the middle of the run.
The reference is the same two models computed here, in this process, from their initial state:
the run's answers must be bit-equal to it, before and after the failover (CPU, one torch thread).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from failsoft.client import Client
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.stateful import sp500_series
from tests.runtime.conftest import wait_for
from tests.zoos import tiny_zoo_of

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
FAMILY, VARIANT = "sp500_gru", "gru_16"
REQUESTS, KILL_AFTER = 30, 12


def gru_repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """The SP500 GRU family, built and quickly profiled once per run (~10 s; :mod:`tests.zoos`)."""
    return tiny_zoo_of(tmp_path_factory, (FAMILY,))


@pytest.fixture(scope="module")
def gru_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    return gru_repository(tmp_path_factory)


def chain_config(repo: ModelRepository, state_dir: str, q_stateful: bool = False) -> Any:
    family = {f.name: f for f in repo.families()}[FAMILY]
    memory = round(6 * family.variant(VARIANT).memory_mb, 3)
    return config_from_dict(
        {
            "name": "graph-failover-test",
            "repository": str(repo.root),
            "servers": [
                {"name": n, "site": site, "memory_mb": memory, "compute": 4.0}
                for n, site in (("s1", "a"), ("s2", "b"), ("s3", "c"))
            ],
            "apps": [
                {
                    "name": app,
                    "family": FAMILY,
                    "rate_rps": 20,
                    "primary": {"server": home, "variant": VARIANT},
                }
                for app, home in (("p", "s1"), ("q", "s2"))
            ],
            "services": [
                {
                    "name": "chain",
                    "mode": "graph",
                    "members": ["p", "q"],
                    "params": {
                        "nodes": [
                            {"name": "p", "app": "p", "stateful": True},
                            {"name": "q", "app": "q", "stateful": q_stateful},
                        ],
                        "edges": [["p", "q"]],
                    },
                }
            ],
            "failover": {"policy": "faillite", "alpha": 0.1},
            "gateway": {"port": 0},
            "agents": {"restart": True, "drain_ms": 100},
            "state_dir": state_dir,
        },
        source="test",
    )


def reference(repo: ModelRepository, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The failure-free run: p then q, each from its initial state, one request at a time."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the agents run (agents.torch_threads)
    try:
        p, q = repo.load(FAMILY, VARIANT, "cpu"), repo.load(FAMILY, VARIANT, "cpu")
        return [q.predict(p.predict(x)) for x in inputs]
    finally:
        torch.set_num_threads(threads)


def replication(client: Client, node: str = "p") -> dict[str, Any]:
    (index,) = [e for e in client.repository_index() if e["name"] == "chain"]
    return dict(index["replication"]["nodes"][node])


def one_at_a_time(
    client: Client, inputs: list[np.ndarray], at: int, fault: Callable[[], Any], what: str
) -> tuple[dict[int, np.ndarray], list[float], dict[str, Any], dict[str, Any]]:
    """Once p's backup holds a state, send ``inputs`` one at a time, ``fault()`` before request
    ``at + 1`` (``what`` it does, for a failure's message), then wait until p's state is durable at
    the last request: the answers by seq, their latencies (ms), and p's replication before and
    after. A failure says at which step it came and where replication stood, for the next reader."""
    wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
    wait_for(lambda: replication(client)["backup_holds"] is not None, 120.0, "p's backup placed", 0.2)
    placed = replication(client)
    assert placed["primary"] == "s1" and placed["backup"] in ("s2", "s3")
    answers: dict[int, np.ndarray] = {}
    latency_ms: list[float] = []
    step = "the requests"
    try:
        for i, x in enumerate(inputs):
            step = f"request {i + 1} of {len(inputs)} ({what} before request {at + 1})"
            if i == at:
                fault()
            raw = client.infer("chain", x, timeout=20.0)  # a slow machine is no failure here
            answers[int(raw.raw["parameters"]["seq"])] = np.asarray(raw.outputs)
            latency_ms.append(raw.latency_ms)
        step = "p's state durable again"
        wait_for(lambda: replication(client)["durable"] == len(inputs), 120.0, step, 0.2)
    except Exception as exc:
        raise AssertionError(f"{step}: {exc!r}; p: {replication(client)}") from exc
    return answers, latency_ms, placed, replication(client)


def assert_promoted_and_exact(
    repo: ModelRepository,
    inputs: list[np.ndarray],
    answers: dict[int, np.ndarray],
    placed: dict[str, Any],
    after: dict[str, Any],
) -> None:
    """Every request answered in order, each answer bit-equal to the failure-free run; p failed over
    once to its backup with its state (nothing lost, nothing divergent), and a new backup placed."""
    assert sorted(answers) == list(range(1, len(inputs) + 1))
    expected = reference(repo, inputs)
    for seq, got in answers.items():
        np.testing.assert_array_equal(got, expected[seq - 1], err_msg=f"request {seq}; p: {after}")
    assert after["failovers"] == 1 and after["lost"] == 0 and after["divergent"] == 0
    assert after["primary"] == placed["backup"]  # the backup was promoted
    assert after["backup"] not in (None, after["primary"])  # and a new one placed


def test_a_killed_stateful_primary_is_replaced_by_its_backup_and_answers_stay_exact(gru_zoo, tmp_path):
    config = chain_config(gru_zoo, str(tmp_path / "state"))
    series = sp500_series()
    inputs = [np.asarray([[series[i]]], dtype=np.float32) for i in range(REQUESTS)]
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            kill = functools.partial(client.admin, "kill", server="s1")
            answers, latency_ms, placed, after = one_at_a_time(client, inputs, KILL_AFTER, kill, "s1 killed")
        finally:
            client.close()
    before, at = latency_ms[:KILL_AFTER], latency_ms[KILL_AFTER]
    print(f"\nlatency ms: before the kill median {np.median(before):.1f}, the request at the kill {at:.1f}, "
          f"after median {np.median(latency_ms[KILL_AFTER + 1 :]):.1f}; p: {after}")  # fmt: skip
    assert_promoted_and_exact(gru_zoo, inputs, answers, placed, after)


def test_under_concurrent_requests_the_failover_replays_and_answers_stay_exact(gru_zoo, tmp_path):
    """Both nodes stateful (each computes in ``seq`` order, so requests may overlap): 4 clients send
    at once, s1 (p's primary, and q's first backup: the first server that is not q's primary) is
    killed mid-run. p's backup lags its primary by the requests in flight, which the failover replays;
    q keeps its primary and gets a new backup."""
    from concurrent.futures import ThreadPoolExecutor

    config = chain_config(gru_zoo, str(tmp_path / "state"), q_stateful=True)
    series = sp500_series()
    n = 3 * REQUESTS
    inputs = [np.asarray([[series[i]]], dtype=np.float32) for i in range(n)]
    answers: dict[int, tuple[int, np.ndarray]] = {}
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
            for node in ("p", "q"):
                wait_for(
                    lambda node=node: replication(client, node)["backup_holds"] is not None,
                    120.0,
                    "backups",
                    0.2,
                )
            placed = {node: replication(client, node) for node in ("p", "q")}
            assert placed["p"]["primary"] == "s1" and placed["q"]["primary"] == "s2"

            def send(i: int) -> None:
                if i == n // 3:
                    client.admin("kill", server="s1")
                raw = client.infer("chain", inputs[i], timeout=20.0)
                answers[int(raw.raw["parameters"]["seq"])] = (i, np.asarray(raw.outputs))

            with ThreadPoolExecutor(4) as pool:
                list(pool.map(send, range(n)))
            for node in ("p", "q"):
                try:
                    wait_for(
                        lambda node=node: replication(client, node)["durable"] == n,
                        120.0,
                        f"{node} durable",
                        0.2,
                    )
                except AssertionError as exc:  # say where replication stood, for the next reader
                    state = {m: replication(client, m) for m in ("p", "q")}
                    raise AssertionError(f"{exc}; {n} requests sent; replication: {state}") from exc
            after = {node: replication(client, node) for node in ("p", "q")}
        finally:
            client.close()
    print(f"\n{after}")
    assert sorted(answers) == list(range(1, n + 1))  # every request answered
    by_seq = [answers[s][0] for s in sorted(answers)]  # which input each seq carried
    expected = reference(gru_zoo, [inputs[i] for i in by_seq])
    for seq, (_, got) in answers.items():
        np.testing.assert_array_equal(got, expected[seq - 1], err_msg=f"request {seq}")
    assert after["p"]["failovers"] == 1 and after["p"]["lost"] == 0 and after["p"]["divergent"] == 0
    assert after["p"]["primary"] == placed["p"]["backup"]
    assert after["q"]["failovers"] == 0 and after["q"]["primary"] == "s2"
    assert after["q"]["backup"] not in (None, "s2")
