"""Tiny models for the engine tests: random weights with a wide initialisation, so that greedy
outputs vary with the context (a barely trained tiny model mostly repeats one byte, which would make
every equality trivially true); the draft is the target with noise added, so some drafts are
accepted and some rejected."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


@pytest.fixture(scope="session")
def pair():
    from transformers import LlamaForCausalLM

    from failsoft.llm.models import LmSpec, wrap

    spec = LmSpec(64, 2, 4, 2, 128, 128, steps=0, batch=1, seq_len=8, lr=0.0, seed=0)
    config = spec.config()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return wrap("test-target", target, "cpu", "test-target"), wrap("test-draft", draft, "cpu", "test-draft")
