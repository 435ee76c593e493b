"""`make bench` is never a minute silent (tests/bench/silence.py)."""

from __future__ import annotations

import io
import sys
import threading

from tests.bench.silence import never_silent


def test_a_silent_stretch_is_broken_by_a_line_naming_the_last_one() -> None:
    out = io.StringIO()
    said = threading.Event()

    class Noted(io.StringIO):
        def write(self, text: str) -> int:
            written = out.write(text)
            if "still measuring" in out.getvalue():
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
    assert "still measuring" in text and "last: 'measuring the floor'" in text


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
