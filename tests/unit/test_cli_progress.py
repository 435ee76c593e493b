"""The hashing progress bar: bytes done/total, percent, MB/s."""

from __future__ import annotations

import io
import re

import pytest

from gantry.cli.live_line import LiveLine
from gantry.cli.progress import ProgressBar, render_progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def terminal_frames(output: str) -> list[str]:
    """What a terminal showed, frame by frame: the line's redraws, without Rich's cursor codes."""
    return [frame for frame in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output).split("\r") if frame]


def test_render_shows_bytes_percent_and_rate() -> None:
    line = render_progress("hashing model", 45_000_000, 90_000_000, 2.0, width=10)
    assert line == "hashing model [#####.....] 45.0/90.0 MB  50% 22.5 MB/s"


def test_render_is_full_at_the_end_and_safe_for_empty_or_instant_work() -> None:
    assert "[##########] 0.0/0.0 MB 100% 0.0 MB/s" in render_progress("x", 0, 0, 0.0, width=10)
    assert "100%" in render_progress("x", 10, 10, 0.0, width=10)


def test_terminal_gets_redraws_and_a_final_line() -> None:
    now = [0.0]
    stream = FakeTerminal()
    bar = ProgressBar("hashing", 2_000_000, stream=stream, clock=lambda: now[0])
    now[0] = 0.5
    bar.advance(1_000_000)
    bar.advance(500_000)  # within 0.1 s of the last draw: coalesced
    now[0] = 1.0
    bar.advance(500_000)
    bar.finish()
    frames = terminal_frames(stream.getvalue())
    assert len(frames) == 3  # 0.5 s, 1.0 s (the draw 0 s after 0.5 s coalesced), the final line
    assert "1.0/2.0 MB" in frames[0]
    assert frames[-1].endswith("2.0/2.0 MB 100% 2.0 MB/s\n")
    assert bar.done == 2_000_000


def test_a_log_gets_only_the_final_line() -> None:
    stream = io.StringIO()
    bar = ProgressBar("hashing", 100, stream=stream, clock=lambda: 1.0)
    bar.advance(60)
    bar.advance(40)
    bar.finish()
    assert "\r" not in stream.getvalue()
    assert stream.getvalue().count("\n") == 1


def test_the_live_line_ends_kept_or_erased() -> None:
    kept, erased = FakeTerminal(), FakeTerminal()
    for stream in (kept, erased):
        line = LiveLine(stream)
        line.draw("sending window 1/3")
        assert line.drawn
        if stream is kept:
            line.abandon()
        else:
            line.clear()
        assert not line.drawn
    assert terminal_frames(kept.getvalue())[-1] == "sending window 1/3\n"
    # Erased: the cursor goes back up to the line's start and the line is wiped (ESC[1A ESC[2K).
    assert erased.getvalue().endswith("\r\x1b[1A\x1b[2K")


def test_a_log_gets_no_redraws_even_when_colour_is_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    stream = io.StringIO()
    line = LiveLine(stream)
    line.draw("hashing")
    line.abandon()
    line.finish("hashed")
    assert not line.interactive and stream.getvalue() == "hashed\n"


def test_a_line_wider_than_the_terminal_is_cropped_not_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrapped line could not be redrawn in place: each redraw would leave a line behind."""
    monkeypatch.setenv("COLUMNS", "20")
    stream = FakeTerminal()
    line = LiveLine(stream)
    line.draw("x" * 50)
    line.draw("y" * 50)
    line.abandon()
    assert [len(frame.rstrip("\n")) for frame in terminal_frames(stream.getvalue())] == [20] * 3
