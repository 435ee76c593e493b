"""The hashing progress bar: bytes done/total, percent, MB/s."""

from __future__ import annotations

import io

from gantry.cli.progress import ProgressBar, render_progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


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
    output = stream.getvalue()
    assert output.count("\r") == 3
    assert output.endswith("2.0/2.0 MB 100% 2.0 MB/s\n")
    assert bar.done == 2_000_000


def test_a_log_gets_only_the_final_line() -> None:
    stream = io.StringIO()
    bar = ProgressBar("hashing", 100, stream=stream, clock=lambda: 1.0)
    bar.advance(60)
    bar.advance(40)
    bar.finish()
    assert "\r" not in stream.getvalue()
    assert stream.getvalue().count("\n") == 1
