"""What of a generation's text may be sent yet, and where a stop sequence ends it (pure).

The adapter decodes everything generated so far after each token and hands the text here. A
delta is only ever text no later token can change, so the deltas joined are exactly the final
text: a trailing U+FFFD is held back (the tokenizer shows half a UTF-8 character that way, and
the next token may complete it), and so is a tail that could still grow into a stop sequence
(the text ends before the first stop, which is never sent). What is held back is sent when the
generation ends, where a lone half character stays the U+FFFD a plain decode shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REPLACEMENT_CHARACTER = "\ufffd"


def first_stop(text: str, stops: Sequence[str], *, start: int = 0) -> int | None:
    """Where the earliest stop sequence begins in `text` (from `start` on), or None."""
    found = [index for stop in stops if (index := text.find(stop, start)) >= 0]
    return min(found) if found else None


def settled_length(text: str, stops: Sequence[str]) -> int:
    """How much of `text` no later token can change: all of it but a trailing run of U+FFFD and
    the longest tail that is a proper prefix of a stop sequence."""
    end = len(text.rstrip(REPLACEMENT_CHARACTER))
    held = 0
    for stop in stops:
        # The longest proper prefix of `stop` that `text[:end]` ends with.
        for size in range(min(len(stop) - 1, end), held, -1):
            if text.endswith(stop[:size], 0, end):
                held = size
                break
    return end - held


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one token changed: the text to send now ("" for none) and whether a stop was hit."""

    delta: str
    stopped: bool


class TextStream:
    """The text sent so far for one generation, advanced with each token's decoded text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._longest_stop = max((len(stop) for stop in self._stops), default=0)
        self._sent = ""
        self._stop_at: int | None = None

    @property
    def sent(self) -> str:
        return self._sent

    @property
    def stopped(self) -> bool:
        return self._stop_at is not None

    def advance(self, decoded: str) -> Step:
        """`decoded` is everything generated so far; after a stop nothing more is sent."""
        if self._stop_at is not None:
            return Step(delta="", stopped=True)
        # A stop cannot begin inside what was sent (its start would have been held back), so
        # only the unsent tail and the stops' length before it are searched.
        start = max(0, len(self._sent) - self._longest_stop + 1)
        self._stop_at = first_stop(decoded, self._stops, start=start)
        if self._stop_at is not None:
            return Step(delta=self._send(decoded[: self._stop_at]), stopped=True)
        settled = decoded[: settled_length(decoded, self._stops)]
        return Step(delta=self._send(settled), stopped=False)

    def finish(self, decoded: str) -> str:
        """The last delta: what remains of the final text (`decoded` cut at a stop) unsent."""
        if self._stop_at is None:
            self._stop_at = first_stop(decoded, self._stops)
        final = decoded if self._stop_at is None else decoded[: self._stop_at]
        if not final.startswith(self._sent):
            # A tokenizer whose decoding rewrote text already sent (none of the byte-level or
            # SentencePiece decoders do): the sent text stands, and the rest follows it.
            final = self._sent + final[len(self._sent) :]
        return self._send(final)

    def _send(self, ready: str) -> str:
        if len(ready) <= len(self._sent) or not ready.startswith(self._sent):
            return ""
        delta, self._sent = ready[len(self._sent) :], ready
        return delta
