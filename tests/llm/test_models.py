"""The LLM pair: deterministic training on the stdlib corpus, stored and loaded like a zoo family."""

from __future__ import annotations

import json

import pytest
import torch

from failsoft.errors import ConfigError
from failsoft.llm import Engine, SamplingParams
from failsoft.llm.corpus import HELD_OUT_FILES, TRAIN_FILES, decode, encode, load_corpus
from failsoft.llm.models import SIZES, LmSpec, PairSpec, build_pair, load_lm, spec_of, train_lm

QUICK = PairSpec(
    target=LmSpec(32, 1, 2, 2, 64, 128, steps=3, batch=2, seq_len=32, lr=1e-3, seed=1),
    draft=LmSpec(16, 1, 2, 2, 32, 128, steps=3, batch=2, seq_len=32, lr=1e-3, seed=2),
)


def test_the_corpus_ships_with_python_and_holds_out_separate_files():
    corpus = load_corpus()
    assert not set(TRAIN_FILES) & set(HELD_OUT_FILES)
    assert len(corpus.train) > 100_000 and len(corpus.held_out) > 10_000
    assert decode(encode("naïve\n")) == "naïve\n"


def test_training_is_deterministic():
    corpus = load_corpus()
    a, _ = train_lm(QUICK.draft, corpus)
    b, _ = train_lm(QUICK.draft, corpus)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_build_stores_loads_and_serves_a_pair(tmp_path, monkeypatch):
    monkeypatch.setitem(SIZES, "tiny", QUICK)
    first = build_pair(tmp_path, "tiny", "cpu")
    assert first["built"] and build_pair(tmp_path, "tiny", "cpu")["built"] is False  # idempotent
    config = json.loads((tmp_path / "llm" / "tiny-draft" / "config.json").read_text())
    assert 0 <= config["acceptance"]["acceptance"] <= 1 and config["acceptance"]["against"] == "tiny-target"
    assert config["corpus"]["files"]["held_out"] == list(HELD_OUT_FILES)
    lm = load_lm(tmp_path, "tiny-target", "cpu")
    profile = json.loads((tmp_path / "llm" / "tiny-target" / "profile.json").read_text())
    assert profile["kv_bytes_per_token"] == lm.kv_bytes_per_token == 2 * 1 * 2 * 16 * 4
    engine = Engine(lm, kv_pages=8, page_size=8)
    assert len(engine.generate("def ", SamplingParams(max_tokens=5, stop_at_eos=False)).output) == 5
    with pytest.raises(ConfigError, match="unknown llm size 'huge'"):
        spec_of("huge")


def test_cli_build_and_generate(tmp_path, monkeypatch, capsys):
    from failsoft.cli import main

    monkeypatch.setitem(SIZES, "tiny", QUICK)
    assert main(["llm", "build", str(tmp_path), "--size", "tiny", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["built"] is True
    argv = ["llm", "generate", "def ", "--root", str(tmp_path), "--size", "tiny", "--max-tokens", "6"]
    assert main([*argv, "--device", "cpu", "--draft-tokens", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 6
    assert main([*argv[:-1], "0", "--device", "cpu"]) != 0
    assert "max_tokens must be in [1, 4096]; got 0" in capsys.readouterr().err
