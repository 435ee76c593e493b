"""Two embed passes side by side on a CPU host under load, each on half its threads.

Why (issue 29, measured on a 2-CPU machine with all-MiniLM-L6-v2's traced pass, batches of 16
sentences, in one process, four rounds): one pass on 1 thread ran 299-326 sentences/s, one pass on
2 threads 519-563/s, and two passes at once on 1 thread each 432-625/s. Through `gantry up` under
32 concurrent one-sentence clients, a host that batched them into one pass at a time ran that
pass on one thread (pass_threads.py: a pass on both CPUs waits at each of its barriers for a
thread the plane has taken), and that one thread was the bound: 258-272 sentences/s with the
host at 3.5 ms of CPU per sentence and the machine a quarter idle. Two passes on one thread each
need no barrier between them, so each runs whenever a CPU is free, and one batch's tokenizing
and answering overlaps the other's pass.

So when a batch of several callers is ready, or a pass is already running, the batch goes to a
lane: one of two threads that run a pass on half the host's threads. A lone call on an idle host
still runs on the serving loop's thread with the measured count (pass_threads.py), and anything
that must run alone (a rerank, a health or probe check, media, a generation, the unload) waits
until both lanes are idle. Each lane's batch holds at most half the batch bound, so the two
passes together hold no more inputs than the one pass the probe measured at the worst case.

`use_lane` and `lane_threads` decide (pure); `PassLanes` runs batches on its threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gantry.worker.model_host.pass_threads import CpuThreads

logger = logging.getLogger("gantry.model_host")

LANES = 2


def lane_threads(threads: int, lanes: int = LANES) -> int:
    """Intra-op threads each lane's pass runs on: an equal share of the host's, at least one."""
    return max(1, threads // lanes)


def lane_batch_inputs(max_batch_inputs: int, lanes: int = LANES) -> int:
    """The inputs one lane's batch holds at most: the lanes together hold no more than the batch
    bound, the largest batch the probe measured."""
    return max(1, max_batch_inputs // lanes)


def least_beside_inputs(max_batch_inputs: int, lanes: int = LANES) -> int:
    """The inputs a batch needs to start beside a running pass: half a lane's batch (at least
    2, at most a lane's). A smaller one waits for more callers, or for the running pass to end,
    whichever comes first: on one thread all-MiniLM-L6-v2 spent 13.8 ms of CPU per sentence in a
    pass of 1, 6.0 ms in one of 4, 4.8 ms in one of 8 and 4.3 ms in one of 16 (issue 29), and
    under load that CPU is what the plane's processes need."""
    lane = lane_batch_inputs(max_batch_inputs, lanes)
    return min(lane, max(2, lane // 2))


def use_lane(*, requests: int, running: int) -> bool:
    """Whether a batch of `requests` callers runs on a lane, with `running` passes in flight
    there: a batch of several callers, or any batch while another pass runs. A lone call on an
    idle host runs on the serving loop's thread with all the measured threads."""
    return requests >= 2 or running > 0


class PassLanes:
    """At most LANES batches run at once, each on a thread of its own whose passes use
    `lane_threads` intra-op threads (torch's count is per thread once a thread has run a pass:
    setting it on a lane leaves the serving loop's as it was)."""

    def __init__(self, *, threads: int, set_threads: Callable[[int], None]) -> None:
        self._lanes = LANES
        self._pool = ThreadPoolExecutor(
            max_workers=LANES,
            thread_name_prefix="pass-lane",
            initializer=set_threads,
            initargs=(lane_threads(threads),),
        )
        self._running = 0
        self._changed = threading.Condition()
        self._passed: Callable[[], None] = lambda: None

    @classmethod
    def for_adapter(cls, adapter: object) -> PassLanes | None:
        """Lanes for a CPU host whose adapter allows passes side by side (`concurrent_passes`)
        and whose measured threads take every CPU it may use (2 or more); None on a GPU, without
        torch, or where the host already leaves CPUs to the rest."""
        if not getattr(adapter, "concurrent_passes", False):
            return None
        cpu = CpuThreads.of(adapter)
        if cpu is None or not cpu.take_every_cpu:
            return None
        return cls(threads=cpu.threads, set_threads=cpu.set_threads)

    @property
    def running(self) -> int:
        with self._changed:
            return self._running

    def on_pass_end(self, passed: Callable[[], None]) -> None:
        """`passed` is called on the lane as each of its batches ends, once the lane counts as
        free (the host's idle clock; a wake for a batch that waits on `running`)."""
        self._passed = passed

    def submit(self, run: Callable[[], None]) -> None:
        """Run `run` (one batch) on a free lane; blocks while both are busy."""
        with self._changed:
            self._changed.wait_for(lambda: self._running < self._lanes)
            self._running += 1
        self._pool.submit(self._run, run)

    def wait_free(self) -> None:
        """Block until a lane is free (so the next batch is collected as late as it can be)."""
        with self._changed:
            self._changed.wait_for(lambda: self._running < self._lanes)

    def wait_idle(self) -> None:
        """Block until no lane runs a batch: what follows runs alone."""
        with self._changed:
            self._changed.wait_for(lambda: self._running == 0)

    def _run(self, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException:
            # The batch answers its own failures; anything past that must not end the lane unseen.
            logger.exception("a pass lane's batch failed")
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()
            self._passed()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
