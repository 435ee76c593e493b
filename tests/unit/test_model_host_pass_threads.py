"""model_host/pass_threads.py: a CPU host's pass after idle leaves one CPU to the rest of the call;
back to back it runs on its measured threads."""

from __future__ import annotations

import pytest

from gantry.worker.model_host.pass_threads import COLD_AFTER_S, PassThreads, threads_for


@pytest.mark.parametrize(
    ("idle_s", "threads", "usable_cpus", "expected"),
    [
        (0.0, 2, 2, 2),  # back to back: the measured count
        (COLD_AFTER_S / 2, 2, 2, 2),
        (COLD_AFTER_S, 2, 2, 1),  # idle: one CPU left to the worker, the plane, the client
        (5.0, 8, 8, 7),
        (5.0, 4, 8, 4),  # the threads leave CPUs free already
        (5.0, 1, 1, 1),  # one CPU: nothing to leave
        (5.0, 1, 2, 1),
    ],
)
def test_threads_for(idle_s: float, threads: int, usable_cpus: int, expected: int) -> None:
    assert threads_for(idle_s, threads=threads, usable_cpus=usable_cpus) == expected


@pytest.mark.parametrize(
    ("requests", "threads", "usable_cpus", "expected"),
    [
        (1, 2, 2, 2),  # one caller back to back: the measured count
        (2, 2, 2, 1),  # callers queued behind each other: the chain is busy beside the pass
        (32, 8, 8, 7),
        (32, 4, 8, 4),  # the threads leave CPUs free already
        (32, 1, 1, 1),
    ],
)
def test_threads_for_a_batch_of_several_callers(
    requests: int, threads: int, usable_cpus: int, expected: int
) -> None:
    assert threads_for(0.0, threads=threads, usable_cpus=usable_cpus, requests=requests) == expected


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sets_torch_threads_only_when_the_count_changes() -> None:
    clock = _Clock()
    calls: list[int] = []
    threads = PassThreads(threads=2, usable_cpus=2, set_threads=calls.append, clock=clock)

    clock.now += 1.0  # the first call after the load finds the host idle
    threads.before_pass()
    clock.now += 0.01
    threads.after_pass()
    assert calls == [1]

    clock.now += 0.001  # the next call comes right after: back to the measured count
    threads.before_pass()
    threads.after_pass()
    clock.now += 0.002
    threads.before_pass()  # again back to back: unchanged, not set again
    threads.after_pass()
    assert calls == [1, 2]

    clock.now += 10 * COLD_AFTER_S
    threads.before_pass()
    threads.after_pass()
    assert calls == [1, 2, 1]

    clock.now += 0.001  # back to back, but a batch of several callers
    threads.before_pass(requests=3)
    threads.after_pass()
    threads.before_pass(requests=1)
    threads.after_pass()
    assert calls == [1, 2, 1, 2]
    threads.before_pass(requests=2)  # from the measured count to one fewer
    assert calls == [1, 2, 1, 2, 1]


def test_a_gpu_host_is_left_alone() -> None:
    class OnGpu:
        uses_cuda = True

    assert PassThreads.for_adapter(OnGpu()) is None
