"""The LLM engine: page accounting, continuous batching, KV checkpoints, speculative decoding."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.llm import CheckpointBuffer, Engine, SamplingParams, speculative_generate
from failsoft.llm.checkpoint import KvChunk
from failsoft.policies.llm_recovery import CheckpointLedger

PROMPTS = ["def main(", "import os\n", "class Foo:\n    ", "    return self", "x"]
GREEDY = SamplingParams(max_tokens=30, stop_at_eos=False)


@pytest.fixture(scope="module")
def alone(pair):
    engine = Engine(pair[0], kv_pages=32, page_size=8)
    out = [engine.generate(p, GREEDY).output for p in PROMPTS]
    assert engine.pool.free == engine.pool.total
    return out


def test_outputs_vary_so_equalities_mean_something(alone):
    assert len({tuple(o) for o in alone}) == len(PROMPTS)
    assert all(len(set(o)) > 5 for o in alone)


def test_continuous_batching_gives_each_request_its_solo_greedy_output(pair, alone):
    engine = Engine(pair[0], kv_pages=64, page_size=8, max_batch=3)
    reqs = [engine.submit(PROMPTS[0], GREEDY)]
    engine.step()
    engine.step()
    reqs += [engine.submit(p, GREEDY) for p in PROMPTS[1:]]
    peak = 0
    while not engine.idle():
        engine.step()
        peak = max(peak, engine.running)
    assert peak == 3  # max_batch bounds the batch; the others joined as requests left
    assert [r.output for r in reqs] == alone
    assert engine.pool.free == engine.pool.total


def test_admission_is_bounded_by_free_pages(pair, alone):
    engine = Engine(pair[0], kv_pages=10, page_size=8)  # a request needs ceil((len+29)/8) = 5 or 6 pages
    reqs = [engine.submit(p, GREEDY) for p in PROMPTS]
    engine.step()
    assert engine.running < len(PROMPTS) and engine.waiting > 0
    assert engine.pool.used <= engine.pool.total
    engine.run()
    assert [r.output for r in reqs] == alone
    assert engine.pool.free == engine.pool.total


def test_cancel_mid_generation_frees_pages_and_leaves_others_alone(pair, alone):
    engine = Engine(pair[0], kv_pages=64, page_size=8)
    keep, drop = engine.submit(PROMPTS[0], GREEDY), engine.submit(PROMPTS[1], GREEDY)
    for _ in range(5):
        engine.step()
    used = engine.pool.used
    engine.cancel(drop.id)
    assert drop.finish_reason == "cancelled" and 0 < len(drop.output) < GREEDY.max_tokens
    assert engine.pool.used == used - 5  # ceil((10 + 30 - 1) / 8) pages of "import os\n" returned
    engine.run()
    assert keep.output == alone[0]
    assert engine.pool.free == engine.pool.total


def test_a_stream_closed_early_cancels_its_request(pair, alone):
    engine = Engine(pair[0], kv_pages=32, page_size=8)
    got = []
    req = engine.submit(PROMPTS[2], GREEDY, on_token=lambda r, t: got.append(t))
    stream = engine.stream(req)
    first = [next(stream) for _ in range(4)]
    stream.close()
    assert first == alone[2][:4] and got == req.output
    assert req.finish_reason == "cancelled" and engine.pool.free == engine.pool.total
    done = engine.generate(PROMPTS[2], GREEDY)
    assert done.ttft_ms is not None and done.ttft_ms > 0 and done.tpot_ms is not None and done.tpot_ms > 0


def test_restore_from_incremental_checkpoint_continues_token_for_token(pair, alone):
    source = Engine(pair[0], kv_pages=32, page_size=8)
    req = source.submit(PROMPTS[3], GREEDY)
    held = CheckpointBuffer()  # the holder's copy, fed only with bytes
    starts = []
    for _ in range(12):
        source.step()
        blob = source.export_kv(req.id)
        if blob is not None:
            chunk = KvChunk.from_bytes(blob)
            starts.append((chunk.first_page, chunk.pages))
            held.add(blob)
    assert starts[0][0] == 0 and all(a + n == b for (a, n), (b, _) in itertools.pairwise(starts))
    assert held.covered_tokens == (len(req.tokens) - 1) // 8 * 8
    source.cancel(req.id)  # the worker fails
    assert source.pool.free == source.pool.total
    other = Engine(pair[0], kv_pages=32, page_size=8)
    resumed = other.restore(held, GREEDY)
    assert resumed.cached == held.covered_tokens
    other.run()
    assert resumed.output == alone[3]
    assert other.pool.free == other.pool.total


def test_checkpoint_driven_by_the_ledger_budget_still_restores_exactly(pair, alone):
    engine = Engine(pair[0], kv_pages=32, page_size=8)
    ledger = CheckpointLedger(engine.kv_mb_per_token, budget_mb=20 * engine.kv_mb_per_token)
    req = engine.submit(PROMPTS[1], GREEDY)
    engine.step()
    assert ledger.assign(req.id, "w0", "w1", engine.cached_tokens(req.id)) is not None
    held = CheckpointBuffer()
    for _ in range(15):
        engine.step()
        covered = ledger.extend(req.id, engine.cached_tokens(req.id))
        if (blob := engine.export_kv(req.id, upto_tokens=covered)) is not None:
            held.add(blob)
    assert held.covered_tokens == 16  # the budget (20 tokens) stops the checkpoint at two full pages
    streamed = list(req.tokens)  # what the client already received
    engine.cancel(req.id)
    other = Engine(pair[0], kv_pages=32, page_size=8)
    resumed = other.restore(held, GREEDY, tokens=streamed)
    other.run()
    assert resumed.output == alone[1]
    ledger.release(req.id)
    assert ledger.total_mb() == 0 and other.pool.free == other.pool.total


def test_speculative_decoding_equals_the_target_and_counts_acceptance(pair, alone):
    target = Engine(pair[0], kv_pages=32, page_size=8)
    draft = Engine(pair[1], kv_pages=32, page_size=8)
    accepted = proposed = 0
    for prompt, expected in zip(PROMPTS, alone, strict=True):
        result = speculative_generate(target, draft, prompt, GREEDY, draft_tokens=3)
        assert list(result.tokens) == expected
        accepted, proposed = accepted + result.accepted, proposed + result.proposed
    assert 0 < accepted < proposed  # some drafts accepted, some rejected: both paths ran
    assert target.pool.free == target.pool.total and draft.pool.free == draft.pool.total
    selfish = speculative_generate(target, Engine(pair[0], 32, 8), PROMPTS[0], GREEDY, draft_tokens=4)
    assert selfish.acceptance == 1.0 and selfish.steps == 6  # 5 tokens per step


def test_a_peer_verifies_drafts_for_a_request_it_is_serving(pair, alone):
    """Alg. 3: the restarted worker (draft only) drafts for a request running on a peer."""
    peer = Engine(pair[0], kv_pages=32, page_size=8)
    req, other = peer.submit(PROMPTS[4], GREEDY), peer.submit(PROMPTS[0], GREEDY)
    peer.step()
    peer.step()
    helper = Engine(pair[1], kv_pages=32, page_size=8)
    mirror = helper.open(req.tokens, SamplingParams(max_tokens=GREEDY.max_tokens))
    while not req.finished:
        drafts = helper.propose(mirror.id, 3)
        verdict = peer.verify(req.id, drafts[: GREEDY.max_tokens - len(req.output)])
        helper.accept(mirror.id, verdict.tokens)
        peer.step()  # the peer's other requests go on between verifications
    helper.close(mirror.id)
    peer.run()
    assert req.output == alone[4] and other.output == alone[0]
    assert peer.pool.free == peer.pool.total and helper.pool.free == helper.pool.total


def test_a_peer_verifies_several_requests_drafts_in_one_batched_pass(pair, alone):
    """A drafting peer's round for three requests of different lengths costs the verifier one
    forward (their caches left-padded and masked), and each output stays the target's own."""
    peer = Engine(pair[0], kv_pages=64, page_size=8)
    reqs = [peer.submit(p, GREEDY) for p in PROMPTS[:3]]
    peer.step()  # prefilled, one token each
    assert len({r.cached for r in reqs}) == 3  # different lengths: the padding is exercised
    helper = Engine(pair[1], kv_pages=64, page_size=8)
    mirrors = [helper.open(r.tokens, SamplingParams(max_tokens=GREEDY.max_tokens)) for r in reqs]
    calls, real = [], peer._call
    peer._call = lambda *a: calls.append(a[0].shape) or real(*a)  # type: ignore[method-assign]
    accepted = proposed = rounds = 0
    while not all(r.finished for r in reqs):
        live = [(r, m) for r, m in zip(reqs, mirrors, strict=True) if not r.finished]
        items = [(r.id, helper.propose(m.id, 3)) for r, m in live]
        before = len(calls)
        verdicts = peer.verify_batch(items)
        if rounds == 0:
            assert calls[before:] == [(3, 4)]  # one pass: 3 requests, the pending token + 3 drafts
        for (_, m), v in zip(live, verdicts, strict=True):
            helper.accept(m.id, v.tokens)
            accepted, proposed = accepted + v.accepted, proposed + v.proposed
        rounds += 1
    assert [r.output for r in reqs] == alone[:3]  # token for token, each request
    assert 0 < accepted < proposed
    for m in mirrors:
        helper.close(m.id)
    assert peer.pool.free == peer.pool.total and helper.pool.free == helper.pool.total


def test_temperature_sampling_is_reproducible_by_seed(pair):
    engine = Engine(pair[0], kv_pages=32, page_size=8)
    hot = [
        engine.generate(PROMPTS[0], SamplingParams(max_tokens=20, temperature=1.0, seed=s)).output
        for s in (1, 1, 2)
    ]
    assert hot[0] == hot[1] != hot[2]


def test_nucleus_sampling_draws_only_from_the_top_p_mass(pair):
    engine = Engine(pair[0], kv_pages=32, page_size=8)
    req = engine.submit("x", SamplingParams(max_tokens=1, temperature=1.0, top_p=0.8, seed=3))
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))  # the nucleus of 0.8: tokens 1 and 3
    drawn = Counter(engine._sample(req, logits) for _ in range(2000))
    assert set(drawn) == {1, 3} and 0.58 < drawn[1] / 2000 < 0.67  # 0.5 / 0.8 renormalised
    engine.cancel(req.id)
    greedy = engine.generate(PROMPTS[0], SamplingParams(max_tokens=20)).output
    one = SamplingParams(max_tokens=20, temperature=1.0, top_p=1e-6, seed=5)  # a nucleus of one token
    assert engine.generate(PROMPTS[0], one).output == greedy


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_tokens": 0}, "max_tokens must be in [1, 4096]; got 0"),
        ({"max_tokens": 10**6}, "got 1000000"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer"),
        ({"temperature": -0.1}, "temperature must be in [0, 10.0]; got -0.1"),
        ({"top_p": 0}, "top_p must be in (0, 1]; got 0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]; got 1.5"),
        ({"seed": 2**64}, "seed must be an integer in [-2**63, 2**64); got 18446744073709551616"),
    ],
)
def test_bad_sampling_parameters_are_refused(kwargs, words):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert words in str(err.value)


def test_bad_requests_are_refused_and_leak_nothing(pair):
    engine = Engine(pair[0], kv_pages=8, page_size=8)
    with pytest.raises(InvalidRequestError, match="130 tokens, longer than the model's context of 128"):
        engine.submit("y" * 130, GREEDY)
    with pytest.raises(
        InvalidRequestError, match=r"prompt of 100 tokens \+ max_tokens 30 exceeds .* context of 128"
    ):
        engine.submit("y" * 100, GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.submit("", GREEDY)
    with pytest.raises(InvalidRequestError, match="token 999 is outside"):
        engine.submit([1, 999], GREEDY)
    with pytest.raises(InvalidRequestError, match="needs 12 KV pages; the engine has 8"):
        engine.submit("y" * 60, SamplingParams(max_tokens=36))
    with pytest.raises(ConfigError, match="kv_pages must be >= 1; got 0"):
        Engine(pair[0], kv_pages=0)
    assert engine.pool.free == engine.pool.total and engine.idle()


def test_checkpoints_of_another_model_or_out_of_order_are_refused(pair):
    source = Engine(pair[0], kv_pages=32, page_size=8)
    req = source.submit(PROMPTS[2], GREEDY)
    blobs = []
    for _ in range(12):
        source.step()
        if (blob := source.export_kv(req.id)) is not None:
            blobs.append(blob)
    assert len(blobs) >= 2
    held = CheckpointBuffer()
    held.add(blobs[0])
    with pytest.raises(ConfigError, match="chunks must arrive in order"):
        held.add(blobs[0])
    with pytest.raises(InvalidRequestError, match="checkpoint is of model 'test-target'"):
        Engine(pair[1], kv_pages=32, page_size=8).restore(held, GREEDY)
    with pytest.raises(ConfigError, match="not a KV checkpoint chunk"):
        held.add(b"garbage")
    source.cancel(req.id)
    assert source.pool.free == source.pool.total


def test_newcomers_are_prefilled_in_groups_within_the_padded_token_budget():
    from types import SimpleNamespace

    from failsoft.llm.engine import _prefill_groups

    reqs = [SimpleNamespace(tokens=[0] * n) for n in (10, 30, 20, 50, 5)]
    groups = [[len(r.tokens) for r in g] for g in _prefill_groups(reqs, budget=60)]
    assert groups == [[10, 30], [20], [50], [5]]  # 3 x 30 > 60; 2 x 50 > 60; 2 x 50 > 60
    assert [len(g) for g in _prefill_groups(reqs[:1], budget=4)] == [1]  # longer than the budget: alone


def test_byte_pair_chat_is_role_lines_then_the_assistant_prompt(pair):
    tok = Engine(pair[0], kv_pages=8).tokenizer
    ids = tok.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert tok.decode(ids) == "system: be brief\nuser: hi\nassistant: "
    with pytest.raises(InvalidRequestError, match="a chat needs at least one message"):
        tok.chat([])
    with pytest.raises(InvalidRequestError, match="message 0 must have a string 'role' and 'content'"):
        tok.chat([{"role": "user"}])
