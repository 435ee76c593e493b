"""How many threads a CPU host's next embed pass runs on: its measured count (cpu_policy), or,
after the host sat idle, for a batch, or while another task runs, fewer, leaving one of the
machine's CPUs to the rest of the call.

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
Where the adapter allows passes side by side, such a batch goes to a lane instead
(pass_lanes.py: two passes at once, each on half the threads), and this rule serves the lone
calls on the serving loop's thread.

Which count a lone call's pass after idle runs on is learnt, not fixed (`ColdPasses`): the same
2-CPU machine measured the opposite in two sessions (a call after 100 ms idle 37.9 ms on 2 threads
against 22.5 ms on 1 in one; 14.0-14.5 and 11.8-11.9 ms on 2 against 16.2-17.3 ms on 1 in another,
runs alternated), so the host times its own such passes on both counts, then runs them on the
faster (the median per input of the last 16 on each), and gives the other every 20th to keep its
figure current.

One caller back to back runs on the measured count unless another task is runnable on the
machine as its pass starts (`others_runnable`: /proc/loadavg's count of runnable tasks, less the
host's own thread reading it): then on one CPU fewer. Why (issue 29, `gantry up` on 2 CPUs, one
sentence at a time): a pass's second thread sleeps through the ~4.5 ms the rest of the chain
takes between passes, so each pass wakes it again, and the kernel places it; where a CPU is busy
then (the worker agent finishing the turn that sent the request, the control plane's reconciler,
the machine's other work) it lands beside a running task or the pass's own first thread and the
two spin at each barrier for each other. Per call, each thread's /proc/<pid>/task/<tid>/schedstat:
in the slowest passes both threads ran and waited 4-18 ms more than their medians, and no other
thread of Gantry or the client ran more. About 12 % of back-to-back passes found a task runnable
at their start. Nine rounds of 600 calls against the untuned encode, alternated with nine
without the rule: p99 over it +4.02 ms median (+1.56 to +5.86) against +6.94 (+4.53 to +10.83),
p50 +1.36 against +1.25. The count is the machine's, so the rule applies only to a host that may
use every CPU of the machine: within a smaller CPU set, a task runnable elsewhere says nothing of
its own CPUs.

`threads_for` and `ColdPasses.choose` decide (pure); `PassThreads` applies them through torch
before each pass, asks `others_runnable` when the rule needs it, and times the cold ones.
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Between the gaps measured: 20 ms idle still favoured all the threads, 50 ms one fewer.
COLD_AFTER_S = 0.03
# Cold passes timed on each count before the faster is chosen; how many recent ones count; and
# how often the other count gets one again.
COLD_SAMPLES = 5
COLD_WINDOW = 16
COLD_RETRY_EVERY = 20
# The machine's runnable tasks now: its fourth field, "running/total" (the reader counted).
LOADAVG = "/proc/loadavg"

logger = logging.getLogger("gantry.model_host")


def threads_for(
    idle_s: float,
    *,
    threads: int,
    usable_cpus: int,
    requests: int = 1,
    cold_after_s: float = COLD_AFTER_S,
    cold_threads: int | None = None,
    others_running: bool = False,
) -> int:
    """The threads of a pass over `requests` callers' inputs that follows `idle_s` seconds
    without one: `threads` (the measured count), or one CPU fewer than the host may use when
    those threads take every one of them and the rest of the chain is awake beside the pass: the
    pass batches several callers, or the host sat idle at least `cold_after_s` (then
    `cold_threads`, the count `ColdPasses` learnt, where it has one), or another task is running
    as a lone call's pass starts back to back (`others_running`)."""
    if threads < usable_cpus or usable_cpus < 2:
        return threads
    if requests >= 2:
        return usable_cpus - 1
    if idle_s < cold_after_s:
        return usable_cpus - 1 if others_running else threads
    return usable_cpus - 1 if cold_threads is None else cold_threads


def others_runnable(path: str = LOADAVG) -> int | None:
    """Tasks runnable on this machine now besides the calling thread; None where unreadable."""
    try:
        with open(path, "rb") as loadavg:
            running = int(loadavg.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - 1)


class ColdPasses:
    """Which of two thread counts a lone call's pass after idle runs on, from this host's own
    such passes: each count's seconds per input, timed."""

    def __init__(self, counts: tuple[int, int]) -> None:
        self.counts = counts  # (one CPU fewer, the measured count): the first explored first
        self._seconds = {count: collections.deque[float](maxlen=COLD_WINDOW) for count in counts}
        self._chosen = 0  # passes given to the faster since both were timed
        self.faster: int | None = None

    def choose(self) -> int:
        """The count for the next cold pass: each in turn until both have COLD_SAMPLES, then
        the one with the lower median, but the other every COLD_RETRY_EVERY-th pass."""
        fewest = min(self.counts, key=lambda count: len(self._seconds[count]))
        if len(self._seconds[fewest]) < COLD_SAMPLES:
            return fewest
        self.faster = min(self.counts, key=self.median)
        self._chosen += 1
        if self._chosen % COLD_RETRY_EVERY == 0:
            return next(count for count in self.counts if count != self.faster)
        return self.faster

    def record(self, count: int, seconds_per_input: float) -> None:
        self._seconds[count].append(seconds_per_input)

    def median(self, count: int) -> float:
        return statistics.median(self._seconds[count])

    def said(self) -> str:
        """The figures behind the choice, for the log."""
        return ", ".join(
            f"{count} threads {self.median(count) * 1000:.2f} ms per input" for count in self.counts
        )


@dataclass(frozen=True)
class CpuThreads:
    """A CPU host's torch threads as measured (its count), the CPUs it may use, and the setter:
    what the pass's thread rules (here, and pass_lanes.py) start from."""

    threads: int
    usable_cpus: int
    set_threads: Callable[[int], None]

    @property
    def take_every_cpu(self) -> bool:
        """The measured threads take every CPU the host may use, and it may use two or more."""
        return self.threads >= self.usable_cpus >= 2

    @classmethod
    def of(cls, adapter: object) -> CpuThreads | None:
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
        runnable: Callable[[], int | None] | None = None,
    ) -> None:
        self._threads = threads
        self._usable_cpus = usable_cpus
        self._set_threads = set_threads
        self._clock = clock
        # `others_runnable` where its answer decides (`for_adapter`); None: never asked.
        self._runnable = runnable
        self._current = threads
        # From the start: the first call after the load finds the host as idle as any other.
        self._last_pass_end = clock()
        # Where the measured count takes every CPU, a lone call's pass after idle runs on the
        # faster of it and one fewer, as timed here.
        self._cold = ColdPasses((usable_cpus - 1, threads)) if threads >= usable_cpus >= 2 else None
        self._timing: tuple[int, float, int] | None = None

    @classmethod
    def for_adapter(cls, adapter: object) -> PassThreads | None:
        """None for a host on a GPU (its passes do not run on these threads) or without torch."""
        cpu = CpuThreads.of(adapter)
        if cpu is None:
            return None
        # Asked only where the answer can matter: the threads take every CPU, and those are the
        # whole machine's (the count is the machine's).
        asks = cpu.take_every_cpu and cpu.usable_cpus == os.cpu_count()
        return cls(
            threads=cpu.threads,
            usable_cpus=cpu.usable_cpus,
            set_threads=cpu.set_threads,
            runnable=others_runnable if asks else None,
        )

    def before_pass(self, requests: int = 1, inputs: int = 1) -> None:
        now = self._clock()
        idle_s = now - self._last_pass_end
        cold = (
            self._cold is not None
            and requests == 1
            and idle_s >= COLD_AFTER_S
            and self._threads >= self._usable_cpus >= 2
        )
        cold_threads = None
        if cold and self._cold is not None:
            before = self._cold.faster
            cold_threads = self._cold.choose()
            if self._cold.faster != before:
                logger.info(
                    "passes after idle run on %d threads: %s", self._cold.faster, self._cold.said()
                )
        wanted = threads_for(
            idle_s,
            threads=self._threads,
            usable_cpus=self._usable_cpus,
            requests=requests,
            cold_threads=cold_threads,
            others_running=self._others_running(requests, idle_s),
        )
        if wanted != self._current:
            self._set_threads(wanted)
            self._current = wanted
        # A cold pass is timed from here: its count's figure in `ColdPasses`.
        self._timing = (wanted, now, max(1, inputs)) if cold_threads is not None else None

    def _others_running(self, requests: int, idle_s: float) -> bool:
        """Whether another task runs as a lone call's back-to-back pass starts, where that
        decides its threads (read only then: a read of /proc/loadavg per such pass)."""
        if self._runnable is None or requests != 1 or idle_s >= COLD_AFTER_S:
            return False
        return (self._runnable() or 0) >= 1

    def after_lane_pass(self) -> None:
        """A pass on a lane (pass_lanes.py) ended: the host was not idle until now."""
        self._last_pass_end = self._clock()

    def after_pass(self) -> None:
        self._last_pass_end = self._clock()
        if self._timing is not None and self._cold is not None:
            count, started, inputs = self._timing
            self._cold.record(count, (self._last_pass_end - started) / inputs)
            self._timing = None
