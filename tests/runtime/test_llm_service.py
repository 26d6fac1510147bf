"""The ``llm`` service on a real cluster: Ray worker actors running the engine, the generate
gateway on 127.0.0.1, the streaming client; a worker killed mid-stream (SIGKILL of its process).

The model is a random-weight Llama with a wide initialisation stored like a built pair (a trained
tiny model mostly repeats one byte, which would make every equality below trivially true). The
workers' steps are slowed (``set_slow``, the chaos of a slow worker) so that a stream is still
running when its worker is killed: no assert is timed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from failsoft.client import Client
from failsoft.errors import InvalidRequestError
from failsoft.llm.corpus import decode, encode

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


def _config(root: Path, policy: str) -> Any:
    from failsoft.runtime.llm_session import llm_config_from_dict

    return llm_config_from_dict(
        {
            "model": {"size": "tiny", "root": str(root), "device": "cpu"},
            "service": {
                "name": "bytes",
                "workers": 3,
                "policy": policy,
                "params": {"checkpoint_budget_mb": 8},
            },
            "engine": {"kv_pages": 64, "page_size": 8, "max_batch": 8, "torch_threads": 1},
            "gateway": {"host": "127.0.0.1", "port": 0},
        }
    )


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from failsoft.runtime.llm_session import LlmSession

    root = tmp_path_factory.mktemp("llm-root")
    _store_random_lm(root)
    s = LlmSession(_config(root, "lumen"), num_cpus=2, build=False).start()
    try:
        yield s
    finally:
        s.stop()


def _stream(client: Client, prompt: str, params: dict[str, Any], out: dict[str, Any]) -> None:
    text: list[str] = []
    last: dict[str, Any] = {}
    for event in client.generate_stream("bytes", prompt, **params):
        text.append(event["text_output"])
        out.setdefault("first", threading.Event()).set()
        last = event.get("parameters", last)
    out["text"], out["parameters"] = "".join(text), last


def _wait(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.runtime
@pytest.mark.slow
def test_generate_stream_and_bad_input(session: Any) -> None:
    # Slowed steps: on a fast machine the tiny model writes all 60 tokens before the gateway's
    # first poll comes back, and the stream is then (rightly) one chunk.
    for w in session.workers.values():
        w.set_slow_sync(20)
    try:
        with Client(session.url, timeout=60) as client:
            whole = client.generate("bytes", PROMPTS[0], **GREEDY)
            chunks = list(client.generate_stream("bytes", PROMPTS[0], **GREEDY))
    finally:
        for w in session.workers.values():
            w.set_slow_sync(0)
    with Client(session.url, timeout=60) as client:
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


@pytest.mark.runtime
@pytest.mark.slow
def test_disconnecting_stream_frees_its_kv(session: Any) -> None:
    for w in session.workers.values():
        w.set_slow_sync(20)
    try:
        cancelled = sum(session.load(w)["cancelled"] for w in session.workers)
        with Client(session.url, timeout=60) as client:
            stream = client.generate_stream("bytes", PROMPTS[1], max_tokens=60)
            next(stream)  # the request runs on some worker, holding its pages
            assert sum(session.load(w)["pages_used"] for w in session.workers) > 0
            stream.close()  # the client leaves mid-generation
        # cancelled on its worker (not left to finish), every page back in the pool
        assert _wait(lambda: sum(session.load(w)["cancelled"] for w in session.workers) == cancelled + 1)
        assert _wait(lambda: sum(session.load(w)["pages_used"] for w in session.workers) == 0)
        assert _wait(lambda: sum(session.load(w)["checkpoints"] for w in session.workers) == 0)
    finally:
        for w in session.workers.values():
            w.set_slow_sync(0)


@pytest.mark.runtime
@pytest.mark.slow
def test_worker_killed_mid_stream_every_stream_completes_identically(session: Any) -> None:
    with Client(session.url, timeout=120) as client:
        reference = {p: client.generate("bytes", p, **GREEDY)["text_output"] for p in PROMPTS}
    for w in session.workers.values():
        w.set_slow_sync(25)
    outs: list[dict[str, Any]] = [{"first": threading.Event()} for _ in PROMPTS]
    clients = [Client(session.url, timeout=120) for _ in PROMPTS]
    threads = [
        threading.Thread(target=_stream, args=(c, p, GREEDY, o), daemon=True)
        for c, p, o in zip(clients, PROMPTS, outs, strict=True)
    ]
    for t in threads:
        t.start()
    try:
        assert all(o["first"].wait(60) for o in outs)
        # the busiest worker dies with its requests' KV
        in_flight = session.dispatcher.describe()["in_flight"]
        victim = max(in_flight, key=lambda w: in_flight[w])
        assert in_flight[victim] > 0
        # let a few pages be checkpointed before the kill
        _wait(lambda: session.dispatcher.stats.shipped_bytes > 0, 20)
        session.kill_worker(victim)
        for t in threads:
            t.join(120)
    finally:
        for c in clients:
            c.close()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.get("text") == reference[prompt], prompt
    stats = session.dispatcher.stats
    assert stats.recovered >= 1
    assert sum(o["parameters"]["recoveries"] for o in outs) == stats.recovered
    assert victim in session.dispatcher.dead
    assert all(o["parameters"]["worker"] != victim for o in outs)
    # the restart: the warm standby adopts the victim's name (no process start, no imports),
    # loads the model and is routed to again; a new standby is started in its place
    assert session.wait_spares() == 1
    standby = session.spares[0]
    standby_pid = standby.info_sync()["pid"]
    assert standby.info_sync()["standby"] is True
    session.restart_worker(victim)
    assert victim not in session.dispatcher.dead
    assert session.workers[victim] is standby
    info = session.workers[victim].info_sync()
    assert info["pid"] == standby_pid and info["worker"] == victim and info["standby"] is False
    assert len(session.spares) == 1 and session.spares[0] is not standby
    assert session.wait_spares() == 1  # the new standby is up too
    assert session.load(victim)["pages_used"] == 0
    with Client(session.url, timeout=120) as client:
        assert client.generate("bytes", PROMPTS[2], **GREEDY)["text_output"] == reference[PROMPTS[2]]
    # the adopted worker itself gives every prompt's greedy output, token for token
    survivor = next(w for w in session.workers if w != victim)
    for prompt in PROMPTS:
        assert _direct(session, victim, prompt) == _direct(session, survivor, prompt)
        assert decode(_direct(session, victim, prompt)) == reference[prompt]
    # a serving worker refuses to adopt another name
    with pytest.raises(InvalidRequestError, match="already serves"):
        session.workers[survivor].adopt_sync(session._specs[victim])


def _direct(session: Any, worker: str, prompt: str) -> list[int]:
    """A greedy generation on one named worker, bypassing the gateway's routing."""
    import asyncio

    ref = session.workers[worker]

    async def run() -> list[int]:
        rid = f"direct-{worker}-{len(prompt)}-{time.monotonic_ns()}"
        await ref.submit(rid, encode(prompt), dict(GREEDY))
        out: list[int] = []
        while True:
            got = await ref.poll(rid, len(out), 5.0)
            out.extend(got["tokens"])
            if got["finished"]:
                return out

    return asyncio.run(run())


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
            LlmWorkerSpec("w1", tmp_path, "tiny-target", "cpu", 64, 8, 8, 1), "tiny-draft", 3000
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


@pytest.mark.runtime
@pytest.mark.slow
def test_progressive_restart_drafts_for_survivors_until_the_target_is_back(session: Any) -> None:
    """LUMEN's restart on the real cluster: the standby loads the draft, drafts for the most
    loaded survivor while its target "reloads" (4 s emulated), then serves; every stream equals its
    no-failure text."""
    with Client(session.url, timeout=120) as client:
        reference = {p: client.generate("bytes", p, **GREEDY)["text_output"] for p in PROMPTS}
    victim = "w1"
    session.wait_spares()
    for name, w in session.workers.items():
        w.set_slow_sync(0 if name == victim else 100)  # slow enough that drafting pays
    session.kill_worker(victim)
    session.reload_delay_ms = 4000.0
    rounds = session.dispatcher.stats.assist_rounds
    restart = threading.Thread(target=session.restart_worker, args=(victim,), daemon=True)
    outs: list[dict[str, Any]] = [{"first": threading.Event()} for _ in PROMPTS]
    clients = [Client(session.url, timeout=120) for _ in PROMPTS]
    threads = [
        threading.Thread(target=_stream, args=(c, p, GREEDY, o), daemon=True)
        for c, p, o in zip(clients, PROMPTS, outs, strict=True)
    ]
    try:
        restart.start()
        assert _wait(lambda: victim in session.dispatcher.dead)
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        restart.join(120)
    finally:
        session.reload_delay_ms = 0.0
        for w in session.workers.values():
            w.set_slow_sync(0)
        for c in clients:
            c.close()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.get("text") == reference[prompt], prompt
    stats = session.dispatcher.stats
    assert stats.assist_rounds > rounds and stats.drafts_accepted > 0
    last = session.restarts[-1]
    assert last["worker"] == victim and last["target_ready"] - last["draft_ready"] >= 3.5
    assert victim not in session.dispatcher.dead
    assert session.workers[victim].info_sync()["phase"] == "full"
