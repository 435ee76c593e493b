"""A byte progress bar on stderr: bytes done/total, percent, MB/s; one final line when not a TTY
(drawn by gantry.cli.live_line)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from gantry.cli.live_line import LiveLine

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
        self._clock = clock
        self._started = clock()
        self._last_draw = float("-inf")
        self._done = 0
        # Redrawn in place on a terminal; a log gets one final line.
        self._line = LiveLine(stream if stream is not None else sys.stderr)

    @property
    def done(self) -> int:
        return self._done

    def advance(self, byte_count: int) -> None:
        self._done += byte_count
        now = self._clock()
        if self._line.interactive and now - self._last_draw >= _REDRAW_EVERY_S:
            self._last_draw = now
            self._line.draw(self._render(now))

    def finish(self) -> None:
        self._line.finish(self._render(self._clock()))

    def _render(self, now: float) -> str:
        return render_progress(self._label, self._done, self._total, now - self._started)
