"""What of a generation's text the model host may stream yet: the deltas join to exactly the final
text, half a UTF-8 character and a tail that could still become a stop sequence wait, and the
text ends before the first stop sequence."""

from __future__ import annotations

import random

import pytest

from gantry.worker.model_host.generated_text import (
    REPLACEMENT_CHARACTER as FFFD,
)
from gantry.worker.model_host.generated_text import (
    TextStream,
    first_stop,
    settled_length,
)


def _stream(decodes: list[str], stops: list[str]) -> tuple[list[str], str, bool]:
    """Feed each token's decoded text, then finish: (deltas sent, the final text, stopped)."""
    text = TextStream(stops)
    deltas = []
    for decoded in decodes:
        step = text.advance(decoded)
        deltas.append(step.delta)
        if step.stopped:
            break
    deltas.append(text.finish(decodes[-1]))
    return deltas, text.sent, text.stopped


def test_plain_text_goes_out_as_it_comes_and_joins_to_the_final_text() -> None:
    deltas, final, stopped = _stream(["He", "Hello", "Hello,", "Hello, world"], [])
    assert deltas == ["He", "llo", ",", " world", ""]
    assert (final, stopped) == ("Hello, world", False)


def test_half_a_character_waits_until_the_next_token_completes_it() -> None:
    # "€" is three UTF-8 bytes; a byte-level tokenizer shows the first two as one U+FFFD.
    decodes = ["a", f"a{FFFD}", f"a{FFFD}", "a€", "a€b"]
    deltas, final, _ = _stream(decodes, [])
    assert deltas == ["a", "", "", "€", "b", ""]
    assert final == "a€b"
    assert FFFD not in "".join(deltas)


def test_half_a_character_left_at_the_end_is_sent_as_a_plain_decode_shows_it() -> None:
    deltas, final, _ = _stream(["ok", f"ok{FFFD}"], [])
    assert deltas == ["ok", "", FFFD]
    assert final == f"ok{FFFD}"


def test_text_ends_before_the_first_stop_sequence_which_is_never_sent() -> None:
    decodes = ["The", "The end", "The end.\n", "The end.\nUser:", "The end.\nUser: more"]
    deltas, final, stopped = _stream(decodes, ["\nUser:"])
    assert "".join(deltas) == final == "The end."
    assert stopped
    # The newline waited: it could have been the start of the stop sequence.
    assert deltas[:3] == ["The", " end", "."]


def test_a_tail_that_turns_out_not_to_be_a_stop_is_released() -> None:
    deltas, final, stopped = _stream(["ab", "abX", "abXY"], ["XYZ"])
    assert deltas == ["ab", "", "", "XY"]
    assert (final, stopped) == ("abXY", False)


def test_a_stop_sequence_spanning_tokens_and_inside_a_token_is_found() -> None:
    assert _stream(["x<", "x</", "x</s>tail"], ["</s>"])[1] == "x"
    assert _stream(["alpha STOPbeta"], ["STOP"])[1] == "alpha "


def test_the_earliest_of_several_stop_sequences_wins() -> None:
    _, final, stopped = _stream(["one two three"], ["three", "two"])
    assert (final, stopped) == ("one ", True)
    assert first_stop("one two three", ["three", "two"]) == 4
    assert first_stop("one", ["x"]) is None


def test_the_held_tail_is_the_longest_any_stop_sequence_could_still_grow_from() -> None:
    assert settled_length("abc", ["cd", "bcx"]) == 1  # "bc" could become "bcx"
    assert settled_length("abc", ["zz"]) == 3
    assert settled_length(f"ab{FFFD}{FFFD}", ["b?"]) == 1  # the U+FFFD run, then "b"


def test_a_decoding_that_rewrites_sent_text_keeps_what_was_sent() -> None:
    text = TextStream([])
    assert text.advance("a ,").delta == "a ,"
    # A tokenizer that cleans up " ," once more text arrives: the sent text stands, and the
    # final text is it and what the decoding holds past its length.
    assert text.advance("a, b").delta == ""
    assert text.finish("a, b c") == "b c"
    assert text.sent == "a ,b c"


@pytest.mark.parametrize("seed", range(20))
def test_random_generations_stream_exactly_their_final_text(seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["a", "b", " ", "\n", "ab", FFFD, "é", "<", "/s", ">", "END"]
    stops = rng.sample(["</s>", "\n\n", "bab", "END"], k=rng.randint(0, 2))
    full = ""
    decodes = []
    for _ in range(rng.randint(1, 40)):
        full += rng.choice(pieces)
        # A U+FFFD that is not last is a byte that stayed invalid; last, it may still complete.
        decodes.append(full)
    deltas, final, stopped = _stream(decodes, stops)
    position = first_stop(full, stops)
    assert "".join(deltas) == final
    assert final == (full if position is None else full[:position])
    assert stopped == (position is not None)
