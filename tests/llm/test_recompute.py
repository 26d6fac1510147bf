"""A request recomputed elsewhere after its worker failed (``submit(..., prompt_len=...)``): the
prompt and the output the client already has are prefilled, generation continues after them, and
with greedy decoding the text equals the uninterrupted one."""

from __future__ import annotations

import pytest

from failsoft.errors import InvalidRequestError
from failsoft.llm import Engine, SamplingParams


def test_recompute_continues_greedy_output_exactly(pair) -> None:
    target, _ = pair
    params = SamplingParams(max_tokens=40)
    prompt = list(b"def main(")
    whole = Engine(target, kv_pages=32, page_size=8).generate(prompt, params).output
    for cut in (1, 17, 39):
        engine = Engine(target, kv_pages=32, page_size=8)
        req = engine.submit(prompt + whole[:cut], params, prompt_len=len(prompt))
        engine.run()
        assert req.output == whole
        assert engine.pool.used == 0


def test_recompute_bad_prompt_len_is_named(pair) -> None:
    target, _ = pair
    engine = Engine(target, kv_pages=32, page_size=8)
    with pytest.raises(InvalidRequestError, match="prompt_len"):
        engine.submit(list(b"abc"), SamplingParams(max_tokens=4), prompt_len=0)
    with pytest.raises(InvalidRequestError, match="reach max_tokens 2"):
        engine.submit(list(b"abcd"), SamplingParams(max_tokens=2), prompt_len=2)
