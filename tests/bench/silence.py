"""`make bench` never runs a minute silent: after SILENT_S without a line of output, a line says it
is still at work and where (the last line it printed), every SILENT_S until the next line.

A thread, not a task: many of the bench's parts block the event loop for seconds (model loads,
footprint readings, the fleet simulator), and a silent stretch is most often one of those."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

SILENT_S = 30.0


class _Watched:
    """stdout, noting when it was last written to and its last non-empty line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.last_write = time.monotonic()
        self.last_line = ""

    def write(self, text: str) -> int:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last_line = lines[-1].strip()
        return self.note(text)

    def note(self, text: str) -> int:
        """Write without becoming the last line: the watcher's own notes name the bench's line,
        not the previous note (which named the one before, quoted once more each time)."""
        self.last_write = time.monotonic()
        written = self._stream.write(text)
        if "\n" in text:  # a pipe (`make bench | tee`) would otherwise hold lines for minutes
            self._stream.flush()
        return written

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def never_silent(silent_s: float = SILENT_S) -> Iterator[None]:
    original = sys.stdout
    watched = _Watched(original)
    stop = threading.Event()
    started = time.monotonic()

    def watch() -> None:
        while not stop.wait(min(5.0, silent_s / 2)):
            quiet = time.monotonic() - watched.last_write
            if quiet >= silent_s:
                watched.note(
                    f"  ... still measuring ({time.monotonic() - started:.0f} s in; last: "
                    f"{watched.last_line[:100]!r})\n"
                )
                watched.flush()

    sys.stdout = watched  # type: ignore[assignment]
    thread = threading.Thread(target=watch, name="bench-never-silent", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.stdout = original
