"""An ``llm`` service under ``failsoft serve``'s session: the controller's worker actors running
the engine on three servers, the one gateway's generate endpoints on 127.0.0.1, the streaming
client; a worker's server killed by chaos mid-stream (SIGKILL of the agent and the worker), the
controller restarting it from a warm standby.

The model is a random-weight Llama with a wide initialisation stored like a built pair (a trained
tiny model mostly repeats one byte, which would make every equality below trivially true). The
workers' steps are slowed (``set_slow``, the chaos of a slow worker) so that a stream is still
running when its worker is killed: no assert is timed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from failsoft.client import Client
from failsoft.errors import InvalidRequestError
from failsoft.llm.corpus import encode

# the tests on the module's cluster are marked runtime (they start Ray); the in-process one only slow

PROMPTS = ("def main(", "The function returns the", "import os\n", "class Foo:")
GREEDY = {"max_tokens": 60, "temperature": 0}


def _store_random_lm(root: Path) -> None:
    """A random wide-init Llama under ``root/llm/tiny-target`` in the layout load_lm reads, and
    its draft ``tiny-draft``: the same weights plus noise (some drafts accepted, some not)."""
    from transformers import LlamaForCausalLM

    from failsoft.llm.models import FORMAT, LmSpec
    from failsoft.zoo.layout import write_json
    from failsoft.zoo.network import save_weights

    spec = LmSpec(64, 2, 4, 2, 128, 128, steps=0, batch=1, seq_len=8, lr=0.0, seed=0)
    config = spec.config()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    module = LlamaForCausalLM(config).eval()
    for name in ("tiny-target", "tiny-draft"):
        if name == "tiny-draft":
            gen = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        where = root / "llm" / name
        where.mkdir(parents=True)
        nbytes, sha = save_weights(module, where / "model.safetensors")
        write_json(
            where / "config.json",
            {
                "format": FORMAT,
                "architecture": module.config.to_dict(),
                "weights": {"file": "model.safetensors", "bytes": nbytes, "sha256": sha},
            },
        )


def _config(root: Path, state: Path, policy: str = "lumen") -> Any:
    from failsoft.runtime.config import config_from_dict

    return config_from_dict(
        {
            "name": "llm-test",
            "servers": [{"name": f"s{i}", "site": "a", "memory_mb": 1024} for i in (1, 2, 3)],
            "services": [
                {
                    "name": "bytes",
                    "mode": "llm",
                    "model": {"size": "tiny", "root": str(root), "device": "cpu"},
                    "workers": 3,
                    "spares": 1,
                    "policy": policy,
                    "params": {"checkpoint_budget_mb": 8},
                    "engine": {"kv_pages": 64, "page_size": 8, "max_batch": 8, "torch_threads": 1},
                    "restart_delay_ms": 4000,  # a restarted target "reloads" 4 s: the draft's time
                }
            ],
            "heartbeat": {"interval_ms": 50, "missed": 3},
            "gateway": {"host": "127.0.0.1", "port": 0},
            "state_dir": str(state),
        }
    )


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from failsoft.runtime.session import Session

    root = tmp_path_factory.mktemp("llm-root")
    _store_random_lm(root)
    s = Session(_config(root, tmp_path_factory.mktemp("state")), num_cpus=2).start()
    try:
        # the gateway mirrors the controller's worker table a moment after it starts
        assert _wait(lambda: len(_dispatcher(s).workers) == 3 and _dispatcher(s).ready())
        yield s
    finally:
        s.stop()


def _dispatcher(session: Any) -> Any:
    return session.gateway.served["bytes"].dispatcher


def _slow(session: Any, ms: float) -> None:
    for w in _dispatcher(session).workers.values():
        w.set_slow_sync(ms)


def _load(session: Any, worker: str) -> dict[str, Any]:
    return dict(_dispatcher(session).workers[worker].load_sync())


def _stream(client: Client, prompt: str, params: dict[str, Any], out: dict[str, Any]) -> None:
    text: list[str] = []
    last: dict[str, Any] = {}
    times: list[float] = []
    for event in client.generate_stream("bytes", prompt, **params):
        times.append(time.monotonic())
        text.append(event["text_output"])
        out.setdefault("first", threading.Event()).set()
        last = event.get("parameters", last)
    out["text"], out["parameters"], out["times"] = "".join(text), last, times


def _wait(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.runtime
@pytest.mark.slow
def test_one_gateway_serves_generate_index_metrics_and_refuses_bad_input(session: Any) -> None:
    # Slowed steps: on a fast machine the tiny model writes all 60 tokens before the gateway's
    # first poll comes back, and the stream is then (rightly) one chunk.
    _slow(session, 20)
    try:
        with Client(session.url, timeout=60) as client:
            whole = client.generate("bytes", PROMPTS[0], **GREEDY)
            chunks = list(client.generate_stream("bytes", PROMPTS[0], **GREEDY))
    finally:
        _slow(session, 0)
    with session.client(timeout=60) as client:
        assert len(chunks) > 2  # streamed, not one answer
        assert "".join(c["text_output"] for c in chunks) == whole["text_output"]
        p = whole["parameters"]
        assert p["output_tokens"] == 60 and p["finish_reason"] == "length"
        assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0
        for bad, named in (
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": 100000}, "100000"),
            ({"temperature": -1}, "temperature"),
            ({"top_k": 5}, "top_k"),
        ):
            with pytest.raises(InvalidRequestError, match=named) as info:
                client.generate("bytes", PROMPTS[0], **bad)
            assert info.value.status == 400
        with pytest.raises(InvalidRequestError, match="context of 128"):
            list(client.generate_stream("bytes", "x" * 200, max_tokens=4))
        with pytest.raises(InvalidRequestError, match="generate"):  # not an infer model
            client.infer("bytes", np.zeros((1, 4), dtype=np.float32))
        (entry,) = [e for e in client.repository_index() if e["name"] == "bytes"]
        assert entry["mode"] == "llm" and entry["state"] == "READY"
        assert sorted(entry["workers"]) == ["w0", "w1", "w2"]
        assert {w["server"] for w in entry["workers"].values()} == {"s1", "s2", "s3"}
        metrics = client._send("GET", "/metrics")
    assert metrics.status_code == 200
    _workers_figures_are_served(metrics.text)


def _workers_figures_are_served(text: str) -> None:
    """The workers' own figures (asked through Ray at each scrape) beside the gateway's, labelled by
    worker, with every series the LLM dashboard reads: the generations above counted."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.runtime.test_dashboards import dashboard_metrics, missing

    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = {s.labels["worker"]: s.value for s in families["failsoft_llm_worker_up"].samples}
    assert up == {"w0": 1.0, "w1": 1.0, "w2": 1.0}
    tokens = sum(s.value for s in families["failsoft_llm_output_tokens"].samples if s.name.endswith("_total"))
    assert tokens >= 120  # the two 60-token generations at least
    ttft = [s.value for s in families["failsoft_llm_ttft_seconds"].samples if s.name.endswith("_count")]
    assert sum(ttft) >= 2
    assert missing(dashboard_metrics("failsoft-llm.json"), text) == []


@pytest.mark.runtime
@pytest.mark.slow
def test_disconnecting_stream_frees_its_kv(session: Any) -> None:
    workers = list(_dispatcher(session).workers)
    _slow(session, 50)  # 3 s for 60 tokens: still running when the loads are read
    try:
        cancelled = sum(_load(session, w)["cancelled"] for w in workers)
        with Client(session.url, timeout=60) as client:
            stream = client.generate_stream("bytes", PROMPTS[1], max_tokens=60)
            next(stream)  # the request runs on some worker, holding its pages
            assert sum(_load(session, w)["pages_used"] for w in workers) > 0
            stream.close()  # the client leaves mid-generation
        # cancelled on its worker (not left to finish), every page back in the pool
        assert _wait(lambda: sum(_load(session, w)["cancelled"] for w in workers) == cancelled + 1)
        assert _wait(lambda: sum(_load(session, w)["pages_used"] for w in workers) == 0)
        assert _wait(lambda: sum(_load(session, w)["checkpoints"] for w in workers) == 0)
    finally:
        _slow(session, 0)


def _openai(session: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{session.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _openai_stream(session: Any, prompt: str, out: dict[str, Any]) -> None:
    """One OpenAI streaming completion, greedy: its text and when each piece came."""
    text: list[str] = []
    times: list[float] = []
    with _openai(session) as client:
        stream = client.completions.create(
            model="bytes", prompt=prompt, max_tokens=60, temperature=0, stream=True
        )
        for chunk in stream:
            times.append(time.monotonic())
            text.append(chunk.choices[0].text if chunk.choices else "")
            out["first"].set()
    out["text"], out["times"] = "".join(text), times


@pytest.mark.runtime
@pytest.mark.slow
def test_the_openai_client_streams_a_chat_completion(session: Any) -> None:
    with _openai(session) as client:
        assert [m.id for m in client.models.list().data] == ["bytes"]
        pieces = client.chat.completions.create(
            model="bytes",
            messages=[{"role": "user", "content": "def main("}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(pieces)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


@pytest.mark.runtime
@pytest.mark.slow
def test_chaos_kill_of_a_workers_server_mid_stream_every_stream_completes_identically(session: Any) -> None:
    """8 OpenAI streaming clients; ``failsoft chaos kill`` on the server of the busiest worker:
    every stream completes with its failure-free greedy text, the controller restarts the worker
    (a warm standby adopts it), and failures and recoveries are events on /v2/events."""
    prompts = [*PROMPTS, *(p + " " for p in PROMPTS)]  # 8 streams
    d = _dispatcher(session)
    with _openai(session) as client:
        reference = {
            p: client.completions.create(model="bytes", prompt=p, max_tokens=60, temperature=0)
            .choices[0]
            .text
            for p in prompts
        }
    events: list[dict[str, Any]] = []

    def listen() -> None:
        with contextlib.suppress(Exception), Client(session.url, timeout=120) as c:
            for event in c.events():
                events.append(event)

    threading.Thread(target=listen, daemon=True).start()
    _slow(session, 25)
    outs: list[dict[str, Any]] = [{"first": threading.Event()} for _ in prompts]
    threads = [
        threading.Thread(target=_openai_stream, args=(session, p, o), daemon=True)
        for p, o in zip(prompts, outs, strict=True)
    ]
    for t in threads:
        t.start()
    assert all(o["first"].wait(60) for o in outs)
    in_flight = d.describe()["in_flight"]
    victim = max(in_flight, key=lambda w: in_flight[w])
    assert in_flight[victim] > 0
    server = d.describe()["workers"][victim]["server"]
    incarnation = d._table[victim]["incarnation"]
    _wait(lambda: d.stats.shipped_bytes > 0, 20)  # a few pages checkpointed before the kill
    recovered = d.stats.recovered
    with session.client() as admin:
        killed_at = time.monotonic()
        (killed,) = admin.admin("kill", server=server)["killed"]
    assert d._table[victim]["pid"] in killed["with"]  # the worker died with its server
    for t in threads:
        t.join(120)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.get("text") == reference[prompt], prompt
    assert d.stats.recovered > recovered  # the victim's streams moved (restored or recomputed)
    # the kill to each stream's next piece (the figure bench llm reports, kill_to_next_token_ms)
    gaps = [next((t for t in o["times"] if t > killed_at), killed_at) - killed_at for o in outs]
    assert all(g < 30 for g in gaps)
    # the controller restarts the worker: a new incarnation serves under its name
    assert _wait(
        lambda: d._table[victim]["phase"] == "serving" and d._table[victim]["incarnation"] > incarnation, 120
    )
    assert victim not in d.dead
    _slow(session, 0)
    with Client(session.url, timeout=120) as client:
        assert client.generate("bytes", PROMPTS[2], **GREEDY)["text_output"] == reference[PROMPTS[2]]
    assert _wait(lambda: {"llm-worker-failed", "llm-worker-recovered"} <= {e.get("type") for e in events})
    assert any(e.get("type") == "llm-request-recovered" for e in events)


@pytest.mark.runtime
@pytest.mark.slow
def test_progressive_restart_drafts_for_the_busiest_survivor_until_the_target_is_back(session: Any) -> None:
    """LUMEN's restart on the serve path: the killed worker's standby loads the draft (phase
    ``draft``), the dispatcher has it draft for the most loaded survivor while its target reloads
    (4 s emulated), then it serves; every stream equals its no-failure text."""
    d = _dispatcher(session)
    with Client(session.url, timeout=120) as client:
        reference = {p: client.generate("bytes", p, **GREEDY)["text_output"] for p in PROMPTS}
    assert _wait(lambda: all(s.get("pid") for s in d._spares), 120)  # a standby is up
    victim = "w2"
    for name, w in d.workers.items():
        w.set_slow_sync(0 if name == victim else 250)  # slow survivors: drafting pays, even here
    rounds, restarts = d.stats.assist_rounds, len(d.stats.restarts)
    os.kill(int(d._table[victim]["pid"]), signal.SIGKILL)
    assert _wait(lambda: victim in d.dead)
    outs: list[dict[str, Any]] = [{"first": threading.Event()} for _ in PROMPTS]
    clients = [Client(session.url, timeout=120) for _ in PROMPTS]
    threads = [
        threading.Thread(target=_stream, args=(c, p, GREEDY, o), daemon=True)
        for c, p, o in zip(clients, PROMPTS, outs, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert _wait(lambda: len(d.stats.restarts) > restarts and d.stats.restarts[-1]["serving"], 120)
    finally:
        _slow(session, 0)
        for c in clients:
            c.close()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.get("text") == reference[prompt], prompt
    last = d.stats.restarts[-1]
    assert last["worker"] == victim and last["draft"] is not None
    assert last["serving"] - last["draft"] >= 3.5  # drafting while the target reloaded
    # it drafted for a survivor; how many drafts a round gets accepted depends on the round's time
    # against the survivor's 0.3 s lease on a busy machine (token equality is what holds)
    assert d.stats.assist_rounds > rounds
    assert victim not in d.dead and d._table[victim]["phase"] == "serving"


@pytest.mark.slow
def test_standby_drafts_for_a_survivor_then_serves_in_process(tmp_path: Path) -> None:
    """Alg. 3 on two workers in this process (no Ray): a standby adopts a name draft-first and
    drafts for a survivor's request, which verifies; the output is the survivor's own greedy one."""
    from failsoft.runtime.llm_worker import LlmWorker, LlmWorkerSpec

    _store_random_lm(tmp_path)
    spec = LlmWorkerSpec("w0", tmp_path, "tiny-target", "cpu", 64, 8, 8, 1)
    survivor = LlmWorker(spec)
    tokens = encode(PROMPTS[1])
    try:
        survivor.submit("ref", tokens, dict(GREEDY))
        assert _wait(lambda: survivor.poll("ref", 0, 0)["finished"])
        reference = survivor.poll("ref", 0, 0)["tokens"]
        survivor.set_slow(30)  # its own loop is slow: the drafts are what speeds it up
        standby = LlmWorker(None)
        assert standby.info()["phase"] == "standby"
        info = standby.adopt(
            LlmWorkerSpec("w1", tmp_path, "tiny-target", "cpu", 64, 8, 8, 1), "tiny-draft", 10000
        )
        assert info["phase"] == "draft" and info["worker"] == "w1"
        with pytest.raises(InvalidRequestError, match="does not serve"):
            standby.verify_drafts([])
        survivor.submit("r", tokens, dict(GREEDY))
        now, proposed, accepted = list(tokens), 0, 0
        while not survivor.poll("r", 0, 0)["finished"]:
            drafts = standby.draft_for([("r", now, 60 - (len(now) - len(tokens)))], 3)
            got = survivor.verify_drafts([("r", len(now), drafts["r"])]) if drafts else {}
            if "r" in got:
                now = got["r"]["tokens"]
                proposed += got["r"]["proposed"]
                accepted += got["r"]["accepted"]
        assert survivor.poll("r", 0, 0)["tokens"] == reference  # token for token
        # while verified for a peer, a request is not decoded by the survivor's own loop (its
        # drafts would be stale); after a lease without verification it is again
        survivor.submit("q", tokens, dict(GREEDY))
        drafts = standby.draft_for([("q", list(tokens), 60)], 3)
        # a request its loop has not admitted yet is not the peer's to verify: wait for that (on
        # a busy host the admission can come after the drafts)
        assert _wait(lambda: survivor._tracked["q"].state == "running")
        survivor.verify_drafts([("q", len(tokens), drafts["q"])])
        with survivor._cond:
            assert survivor._tracked["q"].scheduled is False
            survivor._assisted["q"] = 0.0  # the lease ran out
            survivor._expire_assisted()
            assert survivor._tracked["q"].scheduled is True
        assert _wait(lambda: survivor.poll("q", 0, 0)["finished"])
        assert survivor.poll("q", 0, 0)["tokens"] == reference
        assert proposed > 0 and 0 < accepted <= proposed
        assert survivor.load()["accepted_drafts"] == accepted
        assert standby.wait_target(30)["phase"] == "full"  # the target is back: the draft evicted
        with pytest.raises(InvalidRequestError, match="no draft model"):
            standby.draft_for([("r", now, 1)], 3)
        standby.submit("s", tokens, dict(GREEDY))
        assert _wait(lambda: standby.poll("s", 0, 0)["finished"])
        assert standby.poll("s", 0, 0)["tokens"] == reference
        standby.shutdown()
    finally:
        survivor.shutdown()


@pytest.mark.slow
def test_a_standby_holding_the_draft_drafts_at_once_and_loads_its_target_behind_it_niced(
    tmp_path: Path,
) -> None:
    """LUMEN's restart from a standby that preloaded the draft (in this process, no Ray): the
    adoption loads no draft (``draft_ms`` 0) and drafts at once; the target loads behind it in a
    thread of lower CPU priority, and the engine's loop, once the target serves, is not niced."""
    import os
    import threading

    from failsoft.runtime.llm_worker import LOADER_NICE, LlmWorker, LlmWorkerSpec

    _store_random_lm(tmp_path)
    spec = LlmWorkerSpec("w1", tmp_path, "tiny-target", "cpu", 64, 8, 8, 1)
    standby = LlmWorker(None)
    try:
        held = standby.preload_draft(spec, "tiny-draft")
        assert held["phase"] == "standby" and held["draft"] == "tiny-draft" and held["preload_ms"] > 0
        info = standby.adopt(spec, "tiny-draft", 1500)  # the target 1.5 s behind the draft
        assert info["phase"] == "draft" and info["draft_ms"] == 0.0
        drafts = standby.draft_for([("r", encode(PROMPTS[1]), 20)], 3)
        assert len(drafts["r"]) == 3  # it drafts while its target still loads
        (loader,) = [t for t in threading.enumerate() if t.name == "load-target-w1"]
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert loader.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, loader.native_id) == min(base + LOADER_NICE, 19)
        full = standby.wait_target(60)
        assert full["phase"] == "full" and full["load_ms"] > 0 and full["draft_ms"] == 0.0
        (loop,) = [t for t in threading.enumerate() if t.name == "llm-w1"]
        assert loop.native_id is not None and os.getpriority(os.PRIO_PROCESS, loop.native_id) == base
    finally:
        standby.shutdown()
