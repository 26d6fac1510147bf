"""Random-weight models of real LLM shapes: analytic sizes, the KV formula against a real forward,
a scaled-down shape built, stored as a Hugging Face checkpoint and reloaded."""

from __future__ import annotations

import json

import pytest
import torch

from failsoft.errors import ConfigError
from failsoft.llm import realsize
from failsoft.llm.realsize import (
    SHAPES,
    Shape,
    build_real_size,
    forward_kv_bytes_per_token,
    is_built,
    load_real_size,
    shape_of,
    variant_dir,
)
from failsoft.policies.llm_recovery.load import kv_mb_per_token

# a scaled-down Llama with grouped KV heads (4 query heads share 2 KV heads), built in well under 1 s
MINI = Shape("mini", hidden=64, intermediate=160, layers=3, heads=4, kv_heads=2, vocab=512, context=128)


def test_parameters_match_the_public_counts_and_the_model_itself():
    # the published parameter counts of these checkpoints
    assert SHAPES["llama-2-7b"].parameters() == 6_738_415_616
    assert SHAPES["llama-2-13b"].parameters() == 13_015_864_320
    assert SHAPES["llama-2-70b"].parameters() == 68_976_648_192
    assert SHAPES["tinyllama-1.1b"].parameters() == 1_100_048_384
    for shape in (SHAPES["tinyllama-1.1b"], MINI):  # every tensor counted: the meta model agrees
        model = realsize._meta_model(shape.config())
        assert sum(p.numel() for p in model.parameters()) == shape.parameters(), shape.name


def test_kv_bytes_per_token_formula_equals_a_real_forwards_cache():
    for dtype, nbytes in (("bfloat16", 2), ("float32", 4)):
        torch.manual_seed(0)
        model = __import__("transformers").LlamaForCausalLM(MINI.config(dtype)).to(getattr(torch, dtype))
        check = forward_kv_bytes_per_token(model.eval(), tokens=5)
        assert (
            check["forward"] == check["formula"] == MINI.kv_bytes_per_token(dtype) == 2 * 3 * 2 * 16 * nbytes
        )
        assert check["equal"]
    # Llama-2-70B: the 0.3125 MB per token the simulator and the policies use (Eq. 1)
    assert SHAPES["llama-2-70b"].kv_bytes_per_token() == 327_680 == kv_mb_per_token(80, 8, 128) * 2**20
    assert SHAPES["llama-2-7b"].kv_bytes_per_token("float16") == 2**19  # no GQA: 0.5 MB per token
    with pytest.raises(ConfigError, match="kv_heads must be >= 1"):
        realsize.kv_bytes_per_token(2, 0, 16, 2)
    with pytest.raises(ConfigError, match="unknown real-size shape 'gpt-5'"):
        shape_of("gpt-5")
    with pytest.raises(ConfigError, match="unknown dtype 'int3'"):
        MINI.weight_bytes("int3")


def test_build_stores_shards_and_the_worker_reload_gives_the_same_model(tmp_path):
    from transformers import LlamaForCausalLM

    first = build_real_size(tmp_path, MINI, "bfloat16", shard_bytes=64 * 1024)
    where = variant_dir(tmp_path, MINI, "bfloat16")
    assert first["built"] and len(first["shards"]) > 1  # sharded at 64 KiB
    shards = list(where.glob("*.safetensors"))
    stored = sum(f.stat().st_size - _header_bytes(f) for f in shards)
    assert first["weight_bytes"] == stored == MINI.weight_bytes("bfloat16")
    index = json.loads((where / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f.name for f in shards}
    assert build_real_size(tmp_path, MINI, "bfloat16")["built"] is False  # idempotent
    model, phases = load_real_size(where, "cpu")
    assert set(phases) == {"build_ms", "read_ms", "assign_ms", "total_ms"}
    assert all(p.dtype == torch.bfloat16 and not p.is_meta for p in model.parameters())
    assert forward_kv_bytes_per_token(model, 3)["equal"]
    # a Hugging Face checkpoint: transformers' own loader reads the same weights
    hf = LlamaForCausalLM.from_pretrained(str(where), dtype=torch.bfloat16)
    ours, theirs = model.state_dict(), hf.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, hf.eval()(input_ids=ids).logits)
    # weights are seeded: a second build elsewhere is identical; a norm is ones, a projection is not
    other, _ = load_real_size(build_real_size(tmp_path / "b", MINI)["path"], "cpu")
    assert all(torch.equal(ours[k], v) for k, v in other.state_dict().items())
    assert torch.equal(ours["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    assert 0.01 < float(ours["lm_head.weight"].float().std()) < 0.03


def test_a_truncated_shard_is_not_built_and_is_rebuilt(tmp_path):
    build_real_size(tmp_path, MINI, shard_bytes=64 * 1024)
    where = variant_dir(tmp_path, MINI, "bfloat16")
    shard = sorted(where.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])
    assert not is_built(where)
    assert build_real_size(tmp_path, MINI, shard_bytes=64 * 1024)["built"] is True
    assert is_built(where)


def test_measure_reloads_cold_and_warm_and_extrapolates_what_does_not_fit(tmp_path, monkeypatch):
    from failsoft.bench import llm_realsize

    big = SHAPES["llama-2-70b"]
    real_fits = llm_realsize.fits
    monkeypatch.setattr(llm_realsize, "fits", lambda s, r, d: "too big" if s is big else real_fits(s, r, d))
    out = llm_realsize.run([big, MINI], tmp_path, repeats=1, progress=lambda m: None)
    mini = out["shapes"]["mini"]
    assert mini["measured"] and [r["kind"] for r in mini["loads"]] == ["cold", "warm"]
    assert mini["kv_check"]["equal"] and mini["reload"]["cold"]["reload_ms_mean"] > 0
    seventy = out["shapes"]["llama-2-70b"]
    assert seventy["measured"] is False and seventy["why_not_measured"] == "too big"
    cold = seventy["reload"]["cold"]
    assert cold["analytic"] and cold["from"] == "mini"
    expected = big.weight_bytes() / 1e9 / mini["reload"]["cold"]["read_gb_per_s"] * 1000
    assert cold["reload_ms"] == pytest.approx(expected, rel=1e-3)


def test_a_shape_larger_than_the_memory_does_not_fit(tmp_path, monkeypatch):
    from failsoft.bench import llm_realsize

    monkeypatch.setattr(llm_realsize, "mem_available_bytes", lambda: 8 * 2**30)
    assert llm_realsize.fits(SHAPES["llama-2-7b"], tmp_path, "bfloat16") == (
        "weights 12.6 GiB + 3 GiB margin > 8.0 GiB of available memory"
    )
    assert llm_realsize.fits(MINI, tmp_path, "bfloat16") is None


def test_cli_analytic(capsys):
    from failsoft.cli import main

    assert main(["llm", "real-size", "llama-2-70b", "--analytic"]) == 0
    shape = json.loads(capsys.readouterr().out)["shapes"]["llama-2-70b"]
    assert shape["kv_bytes_per_token"] == 327_680 and shape["weight_bytes"] == 2 * 68_976_648_192


def _header_bytes(path) -> int:
    """A safetensors file's 8-byte length prefix plus its JSON header."""
    raw = path.read_bytes()
    return 8 + int.from_bytes(raw[:8], "little")


def test_warm_reloads_extrapolate_only_from_a_shape_that_was_cached():
    from failsoft.bench.llm_realsize import references

    def measured(name: str, nbytes: int, warm_resident: float) -> dict:
        return {
            "shape": {"name": name},
            "weight_bytes": nbytes,
            "reload": {
                "cold": {"read_gb_per_s": 0.3, "resident_before_mean": 0.0},
                "warm": {"read_gb_per_s": 0.2, "resident_before_mean": warm_resident},
            },
        }

    # the 7B's "warm" reloads found a fifth of it cached (it does not fit twice in memory)
    refs = references([measured("small", 2 * 10**9, 1.0), measured("big", 13 * 10**9, 0.2)])
    assert refs["cold"]["shape"]["name"] == "big" and refs["warm"]["shape"]["name"] == "small"
    assert set(references([measured("big", 13 * 10**9, 0.2)])) == {"cold"}
