"""`make bench` is never a minute silent (tests/bench/silence.py)."""

from __future__ import annotations

import io
import sys
import threading

from tests.bench.silence import never_silent


def test_a_silent_stretch_is_broken_by_lines_naming_the_last_one() -> None:
    out = io.StringIO()
    said = threading.Event()

    class Noted(io.StringIO):
        def write(self, text: str) -> int:
            written = out.write(text)
            if out.getvalue().count("still measuring") >= 2:
                said.set()
            return written

    original = sys.stdout
    sys.stdout = Noted()
    try:
        with never_silent(silent_s=0.05):
            print("measuring the floor")
            assert said.wait(timeout=30)
    finally:
        sys.stdout = original
    text = out.getvalue()
    assert text.startswith("measuring the floor\n")
    # Every note names the bench's own last line, never the note before it.
    notes = [line for line in text.splitlines() if "still measuring" in line]
    assert len(notes) >= 2
    assert all(note.endswith("last: 'measuring the floor')") for note in notes), notes


def test_output_within_the_bound_is_passed_through_alone() -> None:
    out = io.StringIO()
    original = sys.stdout
    sys.stdout = out
    try:
        with never_silent(silent_s=3600):
            print("one line")
    finally:
        sys.stdout = original
    assert out.getvalue() == "one line\n"
