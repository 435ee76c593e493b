"""What every service process does once it is up (gantry.common.process.run_until_signalled):
what it built to start is frozen out of the collector's sight, and SIGTERM ends the wait.

A real child interpreter: freezing is process-wide, so it is never done to the test's own."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, gc, os, signal
from gantry.common.process import run_until_signalled

async def main():
    loop = asyncio.get_running_loop()
    waiting = asyncio.create_task(run_until_signalled())
    # Its first step freezes and installs the handlers, then waits on them; a callback queued
    # after that step runs once it waits, with no clock involved.
    frozen = loop.create_future()
    loop.call_soon(lambda: frozen.set_result(gc.get_freeze_count()))
    print(await frozen, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    await waiting
    print("stopped", flush=True)

asyncio.run(main())
"""


def test_a_service_freezes_its_start_up_objects_then_waits_for_sigterm():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    frozen, stopped = done.stdout.split()
    # The interpreter, asyncio and gantry.common alone hold thousands of tracked objects.
    assert int(frozen) > 1000
    assert stopped == "stopped"
