"""The baseline issue 29 judges `make bench` against: a direct encode as a user gets it, untuned.

`make bench`'s in-process direct encode runs with the model host's settings (GANTRY_BENCH_THREADS
threads, OMP_WAIT_POLICY PASSIVE), which is like against like but slower than what a user's own
`SentenceTransformer(...).encode` gets. This one is plain sentence-transformers in a child process
(tests/bench/untuned_child.py) with the bench's OpenMP, MKL and libgomp variables taken out of its
environment, so torch picks its own threads and libgomp its own wait policy. Each encode is timed
in the child; the bench reads the figure over a pipe, so the pipe is not in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

CHILD = Path(__file__).with_name("untuned_child.py")
# Variables that tune torch's CPU threads: none of ours reaches the untuned child.
TUNING_PREFIXES = ("OMP_", "MKL_", "GOMP_", "KMP_")
READY_TIMEOUT_S = 300.0


def untuned_environment(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if not k.startswith(TUNING_PREFIXES)}


class UntunedDirect:
    """The child's pipe: `encode(n)` is one encode of `n` sentences; its ms, as the child timed."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def encode(self, size: int) -> float:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(f"{size}\n".encode())
        await self._process.stdin.drain()
        line = await self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the untuned encode exited ({self._process.returncode})")
        return float(line)


@contextlib.asynccontextmanager
async def untuned_direct(sentence: str, device: str) -> AsyncIterator[UntunedDirect]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), sentence, device,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=untuned_environment(dict(os.environ)),
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_S)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the untuned encode did not start: {ready!r}")
        yield UntunedDirect(process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
