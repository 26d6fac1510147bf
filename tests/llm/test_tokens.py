"""Incremental detokenization: pieces that concatenate to the whole text, never half a character."""

from __future__ import annotations

import pytest

from failsoft.llm.tokens import BYTES, HfTokenizer, IncrementalDecoder
from tests.llm.tinymodels import train_tokenizer

TEXT = "the node é recovers € 𝄞 cache"  # 2-, 3- and 4-byte characters


@pytest.fixture(scope="module")
def hf():
    return HfTokenizer(train_tokenizer(), "bpe")


def pieces(tokenizer, prompt: list[int], output: list[int], step: int = 1) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, prompt)
    out = [decoder.feed(output[i : i + step]) for i in range(0, len(output), step)]
    return [*out, decoder.flush()]


@pytest.mark.parametrize("step", [1, 2, 3])
def test_byte_tokens_decode_whole_characters_only(step):
    got = pieces(BYTES, BYTES.encode("prompt: "), BYTES.encode(TEXT), step)
    assert "".join(got) == TEXT
    assert not any("\ufffd" in p for p in got)
    assert got[-1] == ""  # nothing was left held back


@pytest.mark.parametrize("step", [1, 2])
def test_bpe_tokens_decode_to_the_text_of_the_whole(hf, step):
    ids = hf.tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT.split())  # the multi-byte characters are several byte tokens
    assert any("\ufffd" in hf.decode([t]) for t in ids)  # decoded alone, a token can be half of one
    got = pieces(hf, hf.encode("recover the"), ids, step)
    assert "".join(got) == hf.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in got)


def test_specials_add_no_text_and_broken_bytes_come_out_at_the_end(hf):
    eos = hf.tok.eos_token_id
    assert pieces(hf, [], [*hf.tok.encode("node", add_special_tokens=False), eos]) == ["node", "", ""]
    # a character never completed: held back while it could be, then replaced
    assert pieces(BYTES, [], [0x6E, 0xE2, 0x82]) == ["n", "", "", "\ufffd"]
