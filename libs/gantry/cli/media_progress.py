"""Progress of a long transcription on stderr, as `progress.py` does it for hashing: on a terminal,
one line redrawn in place (the window on the wire, or an elapsed-time spinner for a clip sent
whole); on a log or a pipe, only the final summary line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

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
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = clock()
        self._spins = 0
        self._drawn = 0  # the longest line drawn, so a shorter one overwrites all of it
        self.interactive = bool(getattr(self._stream, "isatty", lambda: False)())

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def window(self, window: ClipWindow) -> None:
        """The window about to be sent."""
        self._draw(f"{self.label}: {window_label(window)}, {self.elapsed_s:.1f} s")

    def spin(self) -> None:
        """One more turn of the spinner while a whole clip is transcribed."""
        frame = _SPINNER[self._spins % len(_SPINNER)]
        self._spins += 1
        self._draw(f"{self.label}: {frame} {self.elapsed_s:.1f} s (sent whole)")

    def finish(self, summary: str) -> None:
        prefix = "\r" if self._drawn else ""
        self._stream.write(prefix + summary.ljust(self._drawn) + "\n")
        self._stream.flush()
        self._drawn = 0

    def abandon(self) -> None:
        """End a redrawn line before an error is printed under it."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0

    def clear(self) -> None:
        """Erase a redrawn line that no summary follows (a clip that turned out short)."""
        if self._drawn:
            self._stream.write("\r" + " " * self._drawn + "\r")
            self._stream.flush()
            self._drawn = 0

    def _draw(self, line: str) -> None:
        if not self.interactive:
            return
        self._stream.write("\r" + line.ljust(self._drawn))
        self._stream.flush()
        self._drawn = max(self._drawn, len(line))
