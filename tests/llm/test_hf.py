"""Real Hugging Face models: a tiny random-weight Llama and Qwen2, saved with ``save_pretrained``
with a BPE tokenizer trained here and a chat template, loaded by :func:`failsoft.llm.hf.load_hf`.
Every greedy output of the engine (batch 1, a continuous batch, a restored checkpoint, speculative
decoding) must equal ``transformers``' own ``generate(do_sample=False)`` token for token."""

from __future__ import annotations

import pytest
import torch

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.llm import CheckpointBuffer, Engine, SamplingParams, speculative_generate
from failsoft.llm.hf import load_hf
from tests.llm.tinymodels import hf_config as _config
from tests.llm.tinymodels import save_model as _save
from tests.llm.tinymodels import train_tokenizer

PROMPTS = [
    "the node",
    "a page of the cache and the model serve",
    "recover the draft token to verify a batch of cache pages and the node",
    "fail",
]
MAX_NEW = 12
GREEDY = SamplingParams(max_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE with a chat template (:func:`tests.llm.tinymodels.train_tokenizer`)."""
    return train_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def models(request, tokenizer, tmp_path_factory):
    """(target, draft, greedy references of PROMPTS by ``generate``) for one architecture."""
    tmp = tmp_path_factory.mktemp(request.param)
    target = load_hf(_save(tmp, request.param, tokenizer, 64, 2, seed=1), device="cpu")
    # the draft's embeddings are padded wider than the tokenizer (as Qwen2 sizes differ): its ids
    # past the target's vocabulary are proposed, and never accepted
    draft = load_hf(_save(tmp, request.param, tokenizer, 32, 1, seed=2, vocab_pad=64), device="cpu")
    refs = []
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.inference_mode():
            out = target.module.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW
            )
        refs.append(out[0, ids.shape[1] :].tolist())
    return target, draft, refs


def test_references_vary_so_equalities_mean_something(models):
    _, _, refs = models
    assert len({tuple(r) for r in refs}) == len(PROMPTS)
    assert len({t for r in refs for t in r}) > 12


def test_loaded_model_keeps_its_tokenizer_template_and_config(models, tokenizer):
    target, draft, _ = models
    assert target.vocab_size == len(tokenizer) and target.eos_ids == {tokenizer.eos_token_id}
    assert (target.layers, target.kv_heads, target.head_dim, target.context) == (2, 2, 16, 128)
    assert target.fingerprint != draft.fingerprint and draft.vocab_size == len(tokenizer) + 64
    messages = [{"role": "user", "content": "recover the node"}]
    want = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert target.tokenizer.chat(messages) == want
    assert target.tokenizer.decode(tokenizer.encode(PROMPTS[1])) == PROMPTS[1]


def test_batch_one_equals_generate(models):
    target, _, refs = models
    engine = Engine(target, kv_pages=32, page_size=8)
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        req = engine.generate(prompt, GREEDY)
        assert req.output == ref
        assert req.text == target.tokenizer.decode(ref)
    assert engine.pool.free == engine.pool.total


def test_continuous_batch_of_mixed_lengths_arriving_at_different_steps_equals_generate(models):
    target, _, refs = models
    engine = Engine(target, kv_pages=64, page_size=8, max_batch=3)
    reqs = [engine.submit(PROMPTS[0], GREEDY)]
    engine.step()
    reqs += [engine.submit(p, GREEDY) for p in PROMPTS[1:3]]  # 9 and 15 tokens: one padded prefill
    engine.step()
    engine.step()
    reqs.append(engine.submit(PROMPTS[3], GREEDY))  # waits for a slot, then decodes from 1 token
    peak = 0
    while not engine.idle():
        engine.step()
        peak = max(peak, engine.running)
    assert peak == 3
    assert [r.output for r in reqs] == refs
    assert engine.pool.free == engine.pool.total


def test_restored_checkpoint_continues_exactly(models):
    target, _, refs = models
    i = max(range(len(refs)), key=lambda i: len(refs[i]))  # the longest reference
    assert len(refs[i]) > 7
    source = Engine(target, kv_pages=32, page_size=4)
    req = source.submit(PROMPTS[i], GREEDY)
    held = CheckpointBuffer()
    for _ in range(6):
        source.step()
        if (blob := source.export_kv(req.id)) is not None:
            held.add(blob)
    streamed = list(req.tokens)
    assert 0 < held.covered_tokens < len(streamed) - 1
    source.cancel(req.id)  # the worker fails
    other = Engine(target, kv_pages=32, page_size=4)
    resumed = other.restore(held, GREEDY, tokens=streamed)
    other.run()
    assert resumed.output == refs[i]


def test_speculative_output_equals_target_greedy(models):
    target, draft, refs = models
    t, d = Engine(target, kv_pages=32, page_size=8), Engine(draft, kv_pages=32, page_size=8)
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        result = speculative_generate(t, d, prompt, GREEDY, draft_tokens=3)
        assert list(result.tokens) == ref
    selfdraft = speculative_generate(t, Engine(target, kv_pages=32, page_size=8), PROMPTS[1], GREEDY, 3)
    assert list(selfdraft.tokens) == refs[1] and selfdraft.acceptance == 1.0  # multi-token commits
    assert t.pool.free == t.pool.total and d.pool.free == d.pool.total


def test_batched_verification_of_several_requests_equals_target_greedy(models):
    """A peer's round for every prompt at once (one batched pass, caches of different lengths
    left-padded and masked) keeps each output the target's greedy one, on each architecture."""
    target, draft, refs = models
    t, d = Engine(target, kv_pages=64, page_size=8), Engine(draft, kv_pages=64, page_size=8)
    reqs = [t.submit(p, GREEDY) for p in PROMPTS]
    t.step()
    mirrors = [d.open(r.tokens, SamplingParams(max_tokens=GREEDY.max_tokens)) for r in reqs]
    while not all(r.finished for r in reqs):
        live = [(r, m) for r, m in zip(reqs, mirrors, strict=True) if not r.finished]
        verdicts = t.verify_batch([(r.id, d.propose(m.id, 3)) for r, m in live])
        for (_, m), v in zip(live, verdicts, strict=True):
            d.accept(m.id, v.tokens)
    assert [r.output for r in reqs] == refs
    for m in mirrors:
        d.close(m.id)
    assert t.pool.free == t.pool.total and d.pool.free == d.pool.total


def test_a_draft_id_outside_the_targets_vocabulary_is_proposed_and_rejected(models):
    target, _, refs = models
    engine = Engine(target, kv_pages=8, page_size=8)
    req = engine.open(PROMPTS[0], GREEDY)
    verdict = engine.verify(req.id, [target.vocab_size + 3, refs[0][1]])
    assert (verdict.proposed, verdict.accepted, verdict.tokens) == (2, 0, (refs[0][0],))


def test_a_draft_with_another_tokenizer_is_refused(models, pair):
    target, _, _ = models
    with pytest.raises(InvalidRequestError, match="does not share the tokenizer of the target"):
        speculative_generate(Engine(target, kv_pages=8), Engine(pair[1], kv_pages=8), "the", GREEDY)


def test_token_ids_outside_the_models_vocabulary_are_refused(models):
    target, _, _ = models
    with pytest.raises(InvalidRequestError, match=f"outside the vocabulary \\[0, {target.vocab_size}\\)"):
        Engine(target, kv_pages=8).submit([1, target.vocab_size])


def test_a_directory_with_only_pickled_weights_is_refused(tmp_path, tokenizer):
    where = tmp_path / "pickled"
    _config("llama", tokenizer, 32, 1).save_pretrained(where)
    (where / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(
        ConfigError, match=r"only pickled weights \(pytorch_model\.bin\); failsoft loads safetensors only"
    ):
        load_hf(where, device="cpu")


def test_bfloat16_kv_pages_travel_bit_for_bit(tmp_path, tokenizer):
    lm = load_hf(_save(tmp_path, "llama", tokenizer, 32, 1, seed=3), device="cpu", dtype="bfloat16")
    source = Engine(lm, kv_pages=16, page_size=4)
    req = source.submit(PROMPTS[2], SamplingParams(max_tokens=8, stop_at_eos=False))
    source.step()
    held = CheckpointBuffer()
    held.add(source.export_kv(req.id))
    assert held.kv_dtype == "bfloat16" and held.pages == (len(req.tokens) - 1) // 4
    other = Engine(lm, kv_pages=16, page_size=4)
    resumed = other.restore(held, req.params, tokens=req.tokens)
    for mine, theirs in ((other._k, source._k), (other._v, source._v)):
        assert torch.equal(mine[:, resumed.pages[: held.pages]], theirs[:, req.pages[: held.pages]])
    with pytest.raises(InvalidRequestError, match="the checkpoint's KV is bfloat16; this engine's float32"):
        Engine(
            load_hf(_save(tmp_path, "llama", tokenizer, 32, 1, seed=3), device="cpu"),
            kv_pages=16,
            page_size=4,
        ).restore(held, req.params)


def test_record_measures_sizes_load_and_per_batch_speeds(tmp_path, tokenizer):
    from failsoft.llm.record import hf_record

    where = _save(tmp_path, "qwen2", tokenizer, 32, 1, seed=4)
    rec = hf_record(where, device="cpu", batch_sizes=(1, 3), prompt_tokens=8, new_tokens=4)
    shard = where / "model.safetensors"
    assert rec["weights"]["files"] == ["model.safetensors"]
    assert rec["weights"]["file_bytes"] == shard.stat().st_size
    assert rec["weights"]["parameter_bytes"] == 4 * rec["weights"]["parameters"]  # float32
    assert rec["kv_bytes_per_token"] == rec["kv_bytes_per_token_forward"] == 2 * 1 * 2 * 8 * 4
    assert rec["architecture"]["model_type"] == "qwen2" and rec["tokenizer"]["chat_template"] is True
    assert [b["batch"] for b in rec["batches"]] == [1, 3]
    assert all(b["ttft_ms"] > 0 and b["tpot_ms"] > 0 and b["tokens_per_s"] > 0 for b in rec["batches"])
    assert rec["load_ms"] > 0
    with pytest.raises(ConfigError, match="exceed the model's context 128"):
        hf_record(where, device="cpu", batch_sizes=(1,), prompt_tokens=120, new_tokens=16)


def test_cli_generates_from_a_model_directory_through_its_chat_template(tmp_path, tokenizer):
    import json

    from typer.testing import CliRunner

    from failsoft.cli import app

    target = _save(tmp_path, "llama", tokenizer, 32, 1, seed=5)
    draft = _save(tmp_path / "d", "llama", tokenizer, 16, 1, seed=6)
    base = ["llm", "generate", "recover the node", "--model", str(target), "--device", "cpu"]
    res = CliRunner().invoke(app, [*base, "--chat", "--max-tokens", "5"])
    assert res.exit_code == 0, res.output
    plain = json.loads(res.stdout[res.stdout.index("{") :])
    assert 1 <= plain["tokens"] <= 5 and plain["finish_reason"] in ("length", "eos")
    res = CliRunner().invoke(
        app, [*base, "--draft-model", str(draft), "--draft-tokens", "2", "--max-tokens", "5"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{") :])["steps"] >= 1
    res = CliRunner().invoke(app, [*base, "--draft-tokens", "2"])
    assert isinstance(res.exception, ConfigError) and "needs --draft-model" in str(res.exception)
