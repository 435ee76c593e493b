"""A stopped service exits even when a thread would hold it: `exit_even_if_threads_linger`, in a
real child interpreter. Python's exit joins every executor thread, so one blocked for ever kept a
worker alive after it logged its stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A hang guard only, far past the watchdog's 0.5 s: without it the child never exits.
CHILD_TIMEOUT_S = 60.0

CHILD = textwrap.dedent(
    """
    import asyncio, logging, sys, threading
    from gantry.common.process import exit_even_if_threads_linger

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    async def main() -> int:
        if sys.argv[1] == "stuck":
            # An executor thread in a call that never returns (the default executor's).
            asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)
        exit_even_if_threads_linger(3, after_s=0.5)
        return 3

    sys.exit(asyncio.run(main()))
    """
)


def _child(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )


def test_a_thread_blocked_for_ever_does_not_hold_the_exit_and_is_named():
    ended = _child("stuck")
    assert ended.returncode == 3, ended.stderr
    [said] = [line for line in ended.stderr.splitlines() if "held by threads" in line]
    assert "asyncio_0" in said and "MainThread" not in said, said


def test_a_process_that_exits_by_itself_is_not_ended_by_the_watchdog():
    ended = _child("clean")
    assert ended.returncode == 3, ended.stderr
    assert "held by threads" not in ended.stderr, ended.stderr
