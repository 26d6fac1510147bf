"""Stop strings in streamed text: the answer ends before the first one, and nothing sent is ever
part of one (what could still begin a stop string waits for the next piece)."""

from __future__ import annotations

import pytest

from failsoft.llm.tokens import BYTES
from failsoft.runtime.gateway.openai.text import Piece, StopMatcher, TextStream


def run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    sent = []
    for text in pieces:
        piece = matcher.feed(text)
        sent.append(piece.text)
        if piece.stopped:
            return sent, True
    return [*sent, matcher.flush()], False


def test_a_stop_string_split_over_pieces_is_held_back_then_cut():
    assert run(["STOP"], ["abc S", "TO", "P and more"]) == (["abc ", "", ""], True)


def test_a_partial_match_that_fails_is_released_with_the_next_piece():
    sent, stopped = run(["STOP"], ["abc ST", "ART", "ed"])
    assert "".join(sent) == "abc STARTed" and not stopped
    assert sent[0] == "abc "  # "ST" could begin STOP: held


def test_the_earliest_of_several_stops_wins_and_a_stop_may_end_a_piece_or_start_one():
    assert run(["lo", "he"], ["oh hello"]) == (["oh "], True)
    assert run(["x"], ["abc", "x"]) == (["abc", ""], True)
    assert run(["\n\n"], ["one\n", "\ntwo"]) == (["one", ""], True)


@pytest.mark.parametrize("cut", range(1, 12))
def test_every_split_of_the_text_gives_the_same_answer(cut):
    text = "say ababc then"
    sent, stopped = run(["abc"], [text[:cut], text[cut:]])
    assert ("".join(sent), stopped) == ("say ab", True)


def test_no_stop_strings_sends_everything_at_once():
    matcher = StopMatcher([])
    assert matcher.feed("abc") == Piece("abc") and matcher.flush() == ""


def test_text_stream_waits_for_whole_characters_and_releases_what_began_no_stop():
    stream = TextStream(BYTES, [], ["é!"])
    assert stream.feed(BYTES.encode("ok é")[:-1]) == Piece("")  # half of é: no text yet
    assert stream.feed(BYTES.encode("é")[-1:] + BYTES.encode("!")) == Piece("ok ", stopped=True)
    stream = TextStream(BYTES, [], ["zz"])
    assert stream.feed(BYTES.encode("a z")) == Piece("a ")
    assert stream.finish() == Piece("z")  # the held "z" began no stop string after all
