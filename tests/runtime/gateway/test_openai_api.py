"""The OpenAI-compatible endpoints, driven by the official ``openai`` client over real HTTP: a
uvicorn server on 127.0.0.1 serving :func:`openai_router` over a real engine running a tiny
random-weight Llama with a BPE tokenizer trained here (:mod:`tests.llm.tinymodels`)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
import uvicorn
from fastapi import FastAPI

from failsoft.llm import Engine, SamplingParams
from failsoft.llm.hf import load_hf
from failsoft.runtime.gateway.app import _install_error_handlers
from failsoft.runtime.gateway.openai import openai_router
from failsoft.runtime.gateway.server import GatewayServer
from tests.llm.tinymodels import byte_pair, save_model, train_tokenizer
from tests.runtime.conftest import wait_for
from tests.runtime.gateway.engine_backend import EngineBackend

MODEL, SLOW, BYTES = "tiny-llama", "tiny-llama-slow", "tiny-bytes"
CHAT = [{"role": "user", "content": "recover the cache"}]  # 55 greedy tokens, then EOS
PROMPT = "the draft token to verify a batch of"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, {model id: backend}, the loaded model) with the server running."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = load_hf(
        save_model(tmp_path_factory.mktemp("llama"), "llama", train_tokenizer(), 64, 2, seed=1), "cpu"
    )
    backends = {
        MODEL: EngineBackend(MODEL, Engine(lm, kv_pages=64, page_size=8, max_batch=4)),
        SLOW: EngineBackend(SLOW, Engine(lm, kv_pages=64, page_size=8, max_batch=4), step_delay_s=0.05),
        BYTES: EngineBackend(BYTES, Engine(byte_pair()[0], kv_pages=64, page_size=8, max_batch=4)),
    }
    app = FastAPI()
    _install_error_handlers(app)  # the gateway's KServe handlers: the router must answer as OpenAI
    app.include_router(openai_router(backends))
    server = GatewayServer(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    port = server.start_in_thread("openai-test")
    yield f"http://127.0.0.1:{port}", backends, lm
    server.stop()
    torch.set_num_threads(threads)


@pytest.fixture
def client(served):
    with openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=50) as c:
        yield c


def greedy(lm, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The engine's own greedy tokens for ``prompt_ids`` (a fresh engine, no server)."""
    return Engine(lm, kv_pages=32, page_size=8).generate(prompt_ids, SamplingParams(max_tokens)).output


def free(backend: EngineBackend) -> bool:
    return backend.engine.pool.free == backend.engine.pool.total


def test_models_are_listed_and_retrieved(client, served):
    assert [(m.id, m.object, m.owned_by) for m in client.models.list()] == [
        (MODEL, "model", "failsoft"),
        (SLOW, "model", "failsoft"),
        (BYTES, "model", "failsoft"),
    ]
    assert client.models.retrieve(MODEL).model_dump()["max_model_len"] == 128
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-9")
    assert err.value.code == "model_not_found"


def test_greedy_chat_answers_the_engines_greedy_tokens_decoded(client, served):
    _, _, lm = served
    prompt = lm.tokenizer.chat(CHAT)
    ref = greedy(lm, prompt, 12)
    assert len(set(ref)) > 3  # not a degenerate repetition: the equality below means something
    out = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=12)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-") and out.model == MODEL
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == lm.tokenizer.decode(ref)
    assert out.choices[0].finish_reason == ("length" if len(ref) == 12 else "stop")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt), len(ref))
    assert out.usage.total_tokens == len(prompt) + len(ref)
    bigger = client.chat.completions.create(
        model=MODEL, messages=CHAT, temperature=0, max_completion_tokens=14
    )
    assert bigger.choices[0].message.content.startswith(out.choices[0].message.content)


def test_a_byte_level_model_chats_in_its_plain_convention_and_streams_whole_characters(client, served):
    _, backends, _ = served
    engine = backends[BYTES].engine
    prompt = engine.tokenizer.chat(CHAT)
    assert engine.tokenizer.decode(prompt) == "user: recover the cache\nassistant: "
    ref = greedy(engine.lm, prompt, 40)
    whole = client.chat.completions.create(model=BYTES, messages=CHAT, temperature=0, max_tokens=40)
    assert whole.choices[0].message.content == engine.tokenizer.decode(ref)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt), len(ref))
    chunks = client.chat.completions.create(
        model=BYTES, messages=CHAT, temperature=0, max_tokens=40, stream=True
    )
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == whole.choices[0].message.content


def test_completions_of_text_and_of_token_ids(client, served):
    _, backends, lm = served
    ids = lm.tokenizer.encode(PROMPT)
    ref = greedy(lm, ids, 10)
    for prompt in (PROMPT, ids, [PROMPT]):
        out = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=10)
        assert out.object == "text_completion" and out.id.startswith("cmpl-")
        assert out.choices[0].text == lm.tokenizer.decode(ref)
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), len(ref))
    default = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0)
    assert default.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions
    assert free(backends[MODEL])


def test_streamed_deltas_concatenate_to_the_whole_answer(client, served):
    _, backends, _ = served
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=20)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            temperature=0,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 3  # streamed as it came, not in one piece
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in with_choices][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    plain = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=9)
    pieces = list(
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=9, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces) == plain.choices[0].text
    assert pieces[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert free(backends[MODEL])


def test_concurrent_streams_are_batched_and_each_equals_its_engine_greedy_answer(client, served):
    _, backends, lm = served
    prompts = ["the node", "a page of the cache", "serve the model", "verify the batch"]
    refs = [lm.tokenizer.decode(greedy(lm, lm.tokenizer.encode(p), 16)) for p in prompts]

    def stream(prompt: str) -> str:
        chunks = client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=16, stream=True
        )
        return "".join(c.choices[0].text for c in chunks)

    backends[MODEL].peak_batch = 0
    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(stream, prompts)) == refs
    assert backends[MODEL].peak_batch > 1 and free(backends[MODEL])


def test_the_stream_is_server_sent_events_ending_in_done(served):
    base, _, _ = served
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=50) as res:
        assert res.headers["content-type"].startswith("text/event-stream")
        raw = res.read().decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[-3][6:])["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_stop_string_ends_the_answer_before_it_and_cancels_the_request(client, served):
    _, backends, _ = served
    full = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=30)
    text = full.choices[0].message.content
    assert len(text) > 12
    stop = text[6:10]  # spans tokens, most likely; ends the answer where it first occurs
    cut = text[: text.index(stop)]
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, temperature=0, max_tokens=30, stop=[stop, "never-said"]
    )
    assert (out.choices[0].message.content, out.choices[0].finish_reason) == (cut, "stop")
    assert out.usage.completion_tokens < full.usage.completion_tokens
    assert backends[MODEL].requests[out.id].finish_reason == "cancelled"  # closed at the stop
    streamed = client.chat.completions.create(
        model=MODEL, messages=CHAT, temperature=0, max_tokens=30, stop=stop, stream=True
    )
    chunks = [c for c in streamed if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert free(backends[MODEL])


def test_n_other_than_one_is_refused_as_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, n=2)
    assert err.value.status_code == 400 and err.value.param == "n"
    assert "n must be 1" in err.value.message
    assert err.value.body["type"] == "invalid_request_error"


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=CHAT)
    assert err.value.code == "model_not_found" and "gpt-9" in err.value.message


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"seed": 2**64}, "seed", "less than 18446744073709551616"),
        ({"max_tokens": 200}, "max_tokens", "maximum context length is 128 tokens"),
        ({"logprobs": True}, "logprobs", "logprobs is not supported by this server"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
        ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
    ],
)
def test_bad_requests_are_answered_400_with_openais_error_object(served, extra, param, words):
    base, backends, _ = served
    res = httpx.post(
        f"{base}/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **extra}, timeout=50
    )
    error = res.json()["error"]
    assert res.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"
    assert free(backends[MODEL])


def test_a_body_that_is_not_json_or_too_large_is_refused(served):
    base, _, _ = served
    res = httpx.post(f"{base}/v1/completions", content=b"{nope", timeout=50)
    assert res.status_code == 400 and res.json()["error"]["type"] == "invalid_request_error"
    res = httpx.post(f"{base}/v1/completions", content=b" " * (3 << 20), timeout=50)
    assert res.status_code == 413 and "exceeds the limit" in res.json()["error"]["message"]
    res = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": [1, 10**6]}, timeout=50)
    assert res.status_code == 400 and "outside the vocabulary" in res.json()["error"]["message"]


def test_a_service_without_a_live_worker_answers_503(client, served):
    _, backends, _ = served
    backends[MODEL].down = True
    try:
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
    finally:
        backends[MODEL].down = False
    assert err.value.status_code == 503 and err.value.code == "no_route"
    assert err.value.response.headers["retry-after"] == "1"


def test_a_stream_that_fails_after_it_began_ends_with_openais_error_event(client, served):
    _, backends, _ = served
    backends[MODEL].fail_after_tokens = 2
    try:
        stream = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, stream=True)
        with pytest.raises(openai.APIError, match="no other could take it"):
            list(stream)
    finally:
        backends[MODEL].fail_after_tokens = None
    assert free(backends[MODEL])


def test_sampling_is_reproducible_by_seed_and_top_p_narrows_it(client, served):
    _, _, lm = served

    def answer(**sampling):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **sampling)
        return out.choices[0].text

    hot = [answer(temperature=1.0, seed=s) for s in (7, 7, 8)]
    assert hot[0] == hot[1] != hot[2]
    ref = lm.tokenizer.decode(greedy(lm, lm.tokenizer.encode(PROMPT), 12))
    assert answer(temperature=1.0, top_p=1e-6, seed=9) == ref  # a nucleus of one token: greedy


def test_a_client_that_leaves_mid_stream_cancels_its_request(client, served):
    _, backends, lm = served
    backend = backends[SLOW]
    assert len(greedy(lm, lm.tokenizer.chat(CHAT), 50)) == 50  # it would run 50 steps (2.5 s) to the end
    stream = client.chat.completions.create(
        model=SLOW, messages=CHAT, temperature=0, max_tokens=50, stream=True
    )
    first = next(iter(stream))
    assert not backend.requests[first.id].finished
    stream.close()
    wait_for(lambda: backend.requests[first.id].finish_reason == "cancelled", 10, "the request cancelled")
    assert len(backend.requests[first.id].output) < 50 and free(backend)


def test_a_client_that_leaves_before_a_whole_answer_cancels_its_request(served):
    base, backends, _ = served
    backend = backends[SLOW]
    before = set(backend.requests)
    body = {"model": SLOW, "messages": CHAT, "temperature": 0, "max_tokens": 50}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/chat/completions", json=body, timeout=0.5)
    (left,) = wait_for(
        lambda: [r for rid, r in backend.requests.items() if rid not in before and r.finished], 10, "its end"
    )
    assert left.finish_reason == "cancelled" and len(left.output) < 50 and free(backend)
