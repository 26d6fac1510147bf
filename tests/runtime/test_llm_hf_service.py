"""A real Hugging Face model directory served by ``failsoft serve``'s session (``mode: llm``).

The model is a tiny random-weight Llama saved with ``save_pretrained`` beside a byte-level BPE
tokenizer trained here with ``tokenizers`` and a chat template; its draft a smaller Llama with the
same tokenizer (:mod:`tests.llm.tinymodels`). Three workers load the directory with
``transformers``; the official ``openai`` client asks for chat completions; a worker is killed
(SIGKILL) under a streaming chat completion, which completes with its failure-free text while the
controller restarts the worker draft-first. ``failsoft status``'s LLM rows are read from the same
gateway. The workers' steps are slowed (``set_slow``) so that the stream is still running when its
worker dies: no assert is timed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.llm.tinymodels import save_model, train_tokenizer

MESSAGES = [{"role": "user", "content": "recover the node and verify the cache"}]
MAX_TOKENS = 40


def _config(target: Path, draft: Path, state: Path) -> Any:
    from failsoft.runtime.config import config_from_dict

    return config_from_dict(
        {
            "name": "llm-hf-test",
            "servers": [{"name": f"s{i}", "site": "a", "memory_mb": 1024} for i in (1, 2, 3)],
            "services": [
                {
                    "name": "chat",
                    "mode": "llm",
                    "model": {"path": str(target), "draft": str(draft), "device": "cpu"},
                    "workers": 3,
                    "spares": 1,
                    "policy": "lumen",
                    "params": {"checkpoint_budget_mb": 8},
                    "engine": {"kv_pages": 64, "page_size": 8, "max_batch": 8, "torch_threads": 1},
                    "restart_delay_ms": 2000,  # the target "reloads" 2 s: the draft serves first
                }
            ],
            "heartbeat": {"interval_ms": 50, "missed": 3},
            "gateway": {"host": "127.0.0.1", "port": 0},
            "state_dir": str(state),
        }
    )


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int]]:
    """(target dir, draft dir, the target's greedy chat answer by ``transformers``' generate)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = train_tokenizer()
    tmp = tmp_path_factory.mktemp("hf")
    target = save_model(tmp, "llama", tok, 64, 2, seed=1)
    draft = save_model(tmp, "llama", tok, 32, 1, seed=2)
    loaded = AutoTokenizer.from_pretrained(target, local_files_only=True)
    ids = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True).eval()
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=MAX_TOKENS
        )
    return target, draft, out[0, prompt.shape[1] :].tolist()


@pytest.fixture(scope="module")
def session(hf_model: tuple[Path, Path, list[int]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    from failsoft.runtime.session import Session

    target, draft, _ = hf_model
    s = Session(_config(target, draft, tmp_path_factory.mktemp("state")), num_cpus=2).start()
    try:
        assert _wait(lambda: len(_dispatcher(s).workers) == 3 and _dispatcher(s).ready(), 120)
        yield s
    finally:
        s.stop()


def _dispatcher(session: Any) -> Any:
    return session.gateway.served["chat"].dispatcher


def _wait(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def _openai(session: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{session.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_stream(session: Any, out: dict[str, Any]) -> None:
    """One streaming chat completion, greedy: its text, its usage and when each piece came."""
    text: list[str] = []
    with _openai(session) as client:
        stream = client.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            out.setdefault("times", []).append(time.monotonic())
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                out["first"].set()
            if chunk.usage is not None:
                out["usage"] = chunk.usage
    out["text"] = "".join(text)


@pytest.mark.runtime
@pytest.mark.slow
def test_the_openai_client_gets_the_models_greedy_chat_answer(session: Any, hf_model: Any) -> None:
    from transformers import AutoTokenizer

    target, _, reference = hf_model
    tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
    with _openai(session) as client:
        assert [m.id for m in client.models.list().data] == ["chat"]
        answer = client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
    # token for token what transformers' generate answers through the directory's chat template
    assert answer.usage.completion_tokens == len(reference)
    assert answer.choices[0].message.content == tok.decode(reference, skip_special_tokens=True)
    entry = next(e for e in session.client().repository_index() if e["name"] == "chat")
    assert entry["model"] == target.name


@pytest.mark.runtime
@pytest.mark.slow
def test_a_killed_worker_under_a_streaming_chat_leaves_the_stream_complete(
    session: Any, hf_model: Any
) -> None:
    from failsoft.cli.status import llm_index, llm_workers

    target, _, _ = hf_model
    d = _dispatcher(session)
    free: dict[str, Any] = {"first": threading.Event()}
    _chat_stream(session, free)  # the failure-free stream: what the interrupted one must equal
    reference, tokens = free["text"], free["usage"].completion_tokens
    assert tokens > 20  # long enough to be interrupted mid-way
    assert _wait(lambda: all(s.get("pid") for s in d._spares) and d._spares, 120)  # a standby is up
    for w in d.workers.values():
        w.set_slow_sync(60)  # 40 tokens take >2 s: the stream is mid-way when its worker dies
    out: dict[str, Any] = {"first": threading.Event()}
    thread = threading.Thread(target=_chat_stream, args=(session, out), daemon=True)
    thread.start()
    assert out["first"].wait(60)
    in_flight = d.describe()["in_flight"]
    victim = max(in_flight, key=lambda w: in_flight[w])
    assert in_flight[victim] == 1
    with session.client() as client:  # what failsoft status shows, from the same gateway
        rows = llm_workers({"llm": llm_index(client)})
    assert rows is not None and {r["worker"] for r in rows} == {"w0", "w1", "w2"}
    mine = next(r for r in rows if r["worker"] == victim)
    assert mine["active_requests"] == 1 and mine["state"] == "serving" and mine["model"] == target.name
    incarnation = d._table[victim]["incarnation"]
    killed_at = time.monotonic()
    os.kill(int(d._table[victim]["pid"]), signal.SIGKILL)
    thread.join(120)
    assert out.get("text") == reference  # complete, and the failure-free greedy text
    assert out["usage"].completion_tokens == tokens
    assert any(t > killed_at for t in out["times"])  # tokens came after the kill
    assert d.stats.recovered >= 1
    assert _wait(
        lambda: d._table[victim]["phase"] == "serving" and d._table[victim]["incarnation"] > incarnation, 120
    )
    last = d.stats.restarts[-1]
    assert last["worker"] == victim and last["draft"] is not None  # the HF draft loaded first
    for w in d.workers.values():
        w.set_slow_sync(0)
