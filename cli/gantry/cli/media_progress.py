"""Progress of a long transcription on stderr, as `progress.py` does it for hashing: on a terminal,
one line redrawn in place (the window on the wire, or an elapsed-time spinner for a clip sent
whole); on a log or a pipe, only the final summary line. gantry.cli.live_line draws it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from gantry.cli.live_line import LiveLine
from gantry.cli.media_files import ClipWindow

_SPINNER = "|/-\\"
SPIN_EVERY_S = 0.1


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


def window_label(window: ClipWindow) -> str:
    """`window 3/10 (60-90 s)`."""
    return (
        f"window {window.number}/{window.count} "
        f"({_seconds(window.start_s)}-{_seconds(window.end_s)} s)"
    )


def windows_summary(label: str, *, audio_seconds: float, windows: int, elapsed_s: float) -> str:
    return f"{label}: {audio_seconds:.1f} s of audio in {windows} windows, {elapsed_s:.1f} s"


def whole_summary(label: str, *, audio_seconds: float, elapsed_s: float) -> str:
    return f"{label}: {audio_seconds:.1f} s of audio sent whole, {elapsed_s:.1f} s"


class TranscribeProgress:
    """Redraws one stderr line on a terminal; `finish` writes the summary line everywhere."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self._clock = clock
        self._started = clock()
        self._spins = 0
        self._line = LiveLine(stream if stream is not None else sys.stderr)
        self.interactive = self._line.interactive

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def window(self, window: ClipWindow) -> None:
        """The window about to be sent."""
        self._line.draw(f"{self.label}: {window_label(window)}, {self.elapsed_s:.1f} s")

    def spin(self) -> None:
        """One more turn of the spinner while a whole clip is transcribed."""
        frame = _SPINNER[self._spins % len(_SPINNER)]
        self._spins += 1
        self._line.draw(f"{self.label}: {frame} {self.elapsed_s:.1f} s (sent whole)")

    def finish(self, summary: str) -> None:
        self._line.finish(summary)

    def abandon(self) -> None:
        """End a redrawn line before an error is printed under it."""
        self._line.abandon()

    def clear(self) -> None:
        """Erase a redrawn line that no summary follows (a clip that turned out short)."""
        self._line.clear()
