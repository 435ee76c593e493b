"""How many threads a CPU host's next embed pass runs on: its measured count (cpu_policy), or,
after the host sat idle, fewer, leaving one of the machine's CPUs to the rest of the call.

Why (issue 29, measured on a 2-CPU machine, one sentence, the calibrated 2 threads and spin): a
call that reaches an idle host finds the rest of its path (the worker agent, the control plane,
the client) waking up beside it, on the same CPUs. A pass whose OpenMP threads need every CPU
then waits at each of its barriers for a thread that has no CPU: after 50-100 ms idle the pass took
31.3 ms on 2 threads against 15.5 ms on 1, and a call 35.9-37.5 ms against 19.5-20.5 ms. Called
back to back or within 20 ms of each other, 2 threads stay the faster (10.9-14.5 ms against
14.2-16.6 ms a call), so the rule applies only after `COLD_AFTER_S` idle, and only where the
host's threads take every CPU it may use. A host on a GPU is left as it is.

The same holds under load: a pass that batches several callers' inputs runs while the plane
handles the calls behind them, on the same CPUs. Measured with 32 concurrent one-sentence
clients on 2 CPUs: the host's CPU per sentence 5.5-6.2 ms on 2 threads against 3.7-3.9 ms on 1,
and 175-223 sentences/s against 194-253 (the same session, two runs each way). So a pass of
several callers runs on one CPU fewer too; one caller back to back keeps the measured count.

`threads_for` decides (pure); `PassThreads` applies it through torch before each pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Between the gaps measured: 20 ms idle still favoured all the threads, 50 ms one fewer.
COLD_AFTER_S = 0.03


def threads_for(
    idle_s: float,
    *,
    threads: int,
    usable_cpus: int,
    requests: int = 1,
    cold_after_s: float = COLD_AFTER_S,
) -> int:
    """The threads of a pass over `requests` callers' inputs that follows `idle_s` seconds
    without one: `threads` (the measured count), or one CPU fewer than the host may use when
    those threads take every one of them and the rest of the chain is awake beside the pass: the
    host sat idle at least `cold_after_s`, or the pass batches several callers."""
    if threads < usable_cpus or usable_cpus < 2:
        return threads
    if idle_s < cold_after_s and requests < 2:
        return threads
    return usable_cpus - 1


class PassThreads:
    """Sets torch's thread count before each pass as `threads_for` says (only when it changes:
    libgomp keeps its pool, it only uses fewer of its threads)."""

    def __init__(
        self,
        *,
        threads: int,
        usable_cpus: int,
        set_threads: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threads = threads
        self._usable_cpus = usable_cpus
        self._set_threads = set_threads
        self._clock = clock
        self._current = threads
        # From the start: the first call after the load finds the host as idle as any other.
        self._last_pass_end = clock()

    @classmethod
    def for_adapter(cls, adapter: object) -> PassThreads | None:
        """None for a host on a GPU (its passes do not run on these threads) or without torch."""
        if getattr(adapter, "uses_cuda", False):
            return None
        try:
            import torch
        except ImportError:
            return None
        return cls(
            threads=torch.get_num_threads(),
            usable_cpus=len(os.sched_getaffinity(0)),
            set_threads=torch.set_num_threads,
        )

    def before_pass(self, requests: int = 1) -> None:
        idle_s = self._clock() - self._last_pass_end
        wanted = threads_for(
            idle_s, threads=self._threads, usable_cpus=self._usable_cpus, requests=requests
        )
        if wanted != self._current:
            self._set_threads(wanted)
            self._current = wanted

    def after_pass(self) -> None:
        self._last_pass_end = self._clock()
