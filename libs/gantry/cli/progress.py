"""A byte progress bar on stderr: bytes done/total, percent, MB/s; one final line when not a TTY."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_MB = 1_000_000
_REDRAW_EVERY_S = 0.1


def render_progress(label: str, done: int, total: int, elapsed_s: float, *, width: int = 28) -> str:
    """One line, e.g. `hashing [#######.....]  45.0/90.0 MB  50%  120.3 MB/s`."""
    fraction = 1.0 if total <= 0 else min(max(done / total, 0.0), 1.0)
    filled = round(fraction * width)
    bar = "#" * filled + "." * (width - filled)
    rate = done / _MB / elapsed_s if elapsed_s > 0 else 0.0
    return (
        f"{label} [{bar}] {done / _MB:.1f}/{total / _MB:.1f} MB"
        f" {fraction * 100:3.0f}% {rate:.1f} MB/s"
    )


class ProgressBar:
    """Counts bytes as they are hashed and redraws at most every 0.1 s."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label = label
        self._total = total
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = clock()
        self._last_draw = float("-inf")
        self._done = 0
        # Carriage-return redraws only make sense on a terminal; a log gets one final line.
        self._interactive = bool(getattr(self._stream, "isatty", lambda: False)())

    @property
    def done(self) -> int:
        return self._done

    def advance(self, byte_count: int) -> None:
        self._done += byte_count
        now = self._clock()
        if self._interactive and now - self._last_draw >= _REDRAW_EVERY_S:
            self._last_draw = now
            self._stream.write("\r" + self._line(now))
            self._stream.flush()

    def finish(self) -> None:
        prefix = "\r" if self._interactive else ""
        self._stream.write(prefix + self._line(self._clock()) + "\n")
        self._stream.flush()

    def _line(self, now: float) -> str:
        return render_progress(self._label, self._done, self._total, now - self._started)
