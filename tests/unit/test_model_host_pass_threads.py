"""model_host/pass_threads.py: a CPU host's pass of several callers leaves one CPU to the rest of
the calls; a lone call's pass after idle runs on whichever of its measured threads and one fewer
its own timed passes found faster; back to back it runs on its measured threads."""

from __future__ import annotations

import pytest

from gantry.worker.model_host.pass_threads import (
    COLD_AFTER_S,
    COLD_RETRY_EVERY,
    COLD_SAMPLES,
    ColdPasses,
    PassThreads,
    others_runnable,
    threads_for,
)


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


def test_threads_for_after_idle_takes_the_learnt_count() -> None:
    assert threads_for(1.0, threads=2, usable_cpus=2, cold_threads=2) == 2
    assert threads_for(1.0, threads=2, usable_cpus=2, cold_threads=1) == 1
    # Back to back, or a batch of several callers, the learnt count plays no part.
    assert threads_for(0.0, threads=2, usable_cpus=2, cold_threads=1) == 2
    assert threads_for(1.0, threads=2, usable_cpus=2, requests=3, cold_threads=2) == 1


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

    clock.now += 1.0  # the first call after the load finds the host idle: one fewer timed first
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

    clock.now += 0.001  # back to back, but a batch of several callers
    threads.before_pass(requests=3)
    threads.after_pass()
    threads.before_pass(requests=1)
    threads.after_pass()
    assert calls == [1, 2, 1, 2]
    threads.before_pass(requests=2)  # from the measured count to one fewer
    assert calls == [1, 2, 1, 2, 1]


@pytest.mark.parametrize(
    ("idle_s", "threads", "usable_cpus", "requests", "expected"),
    [
        (0.0, 2, 2, 1, 1),  # back to back, another task running: one CPU left to it
        (0.0, 8, 8, 1, 7),
        (0.0, 4, 8, 1, 4),  # the threads leave CPUs free already
        (0.0, 1, 1, 1, 1),  # one CPU: nothing to leave
        (0.0, 2, 2, 3, 1),  # a batch: one fewer whatever runs
    ],
)
def test_threads_for_a_lone_call_while_another_task_runs(
    idle_s: float, threads: int, usable_cpus: int, requests: int, expected: int
) -> None:
    assert (
        threads_for(
            idle_s,
            threads=threads,
            usable_cpus=usable_cpus,
            requests=requests,
            others_running=True,
        )
        == expected
    )
    # After idle the learnt count decides, as without the task.
    assert threads_for(1.0, threads=2, usable_cpus=2, cold_threads=2, others_running=True) == 2


class _Runnable:
    """What /proc/loadavg would say: the tasks runnable besides the reader; each read counted."""

    def __init__(self, others: int | None) -> None:
        self.others = others
        self.reads = 0

    def __call__(self) -> int | None:
        self.reads += 1
        return self.others


def test_a_back_to_back_pass_leaves_a_cpu_while_another_task_runs() -> None:
    clock = _Clock()
    calls: list[int] = []
    runnable = _Runnable(0)
    threads = PassThreads(
        threads=2, usable_cpus=2, set_threads=calls.append, clock=clock, runnable=runnable
    )
    threads.after_pass()  # the host just answered: the next pass is back to back
    threads.before_pass()
    threads.after_pass()
    assert (calls, runnable.reads) == ([], 1)  # none runs beside it: the measured count
    runnable.others = 1
    threads.before_pass()
    threads.after_pass()
    assert calls == [1]
    runnable.others = None  # unreadable: the measured count, as before the rule
    threads.before_pass()
    threads.after_pass()
    assert calls == [1, 2]
    threads.before_pass(requests=3)  # a batch is one fewer anyway: nothing read
    threads.after_pass()
    assert runnable.reads == 3
    clock.now += 1.0  # after idle: the cold passes' rule, nothing read
    threads.before_pass()
    threads.after_pass()
    assert runnable.reads == 3


def test_others_runnable_reads_the_machines_count_less_the_reader(tmp_path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.41 0.30 3/456 7890\n")
    assert others_runnable(str(loadavg)) == 2
    loadavg.write_text("0.52 0.41 0.30 1/456 7890\n")
    assert others_runnable(str(loadavg)) == 0
    loadavg.write_text("garbled\n")
    assert others_runnable(str(loadavg)) is None
    assert others_runnable(str(tmp_path / "absent")) is None
    assert others_runnable() is not None  # this machine's own /proc/loadavg


def cold_pass(
    threads: PassThreads, clock: _Clock, seconds: dict[int, float], inputs: int = 1
) -> int:
    """One lone call's pass after idle, taking `seconds[count]` per input on the count it runs
    on; that count."""
    ran: list[int] = []
    threads._set_threads = ran.append  # type: ignore[method-assign]
    clock.now += 1.0
    threads.before_pass(inputs=inputs)
    count = ran[-1] if ran else threads._current
    clock.now += seconds[count] * inputs
    threads.after_pass()
    return count


@pytest.mark.parametrize(("faster", "slower"), [(1, 2), (2, 1)])
def test_passes_after_idle_learn_the_faster_count(faster: int, slower: int) -> None:
    clock = _Clock()
    threads = PassThreads(threads=2, usable_cpus=2, set_threads=lambda _: None, clock=clock)
    seconds = {faster: 0.004, slower: 0.009}
    explored = [cold_pass(threads, clock, seconds) for _ in range(2 * COLD_SAMPLES)]
    assert explored == [1, 2] * COLD_SAMPLES  # each in turn, one fewer first
    chosen = [cold_pass(threads, clock, seconds, inputs=3) for _ in range(2 * COLD_RETRY_EVERY)]
    # The faster from then on, but the other every COLD_RETRY_EVERY-th pass.
    assert chosen.count(slower) == 2
    assert chosen[COLD_RETRY_EVERY - 1] == slower
    assert set(chosen) - {slower} == {faster}


def test_the_choice_follows_the_recent_passes() -> None:
    cold = ColdPasses((1, 2))
    for _ in range(COLD_SAMPLES):
        cold.record(1, 0.004)
        cold.record(2, 0.009)
    assert cold.choose() == 1
    for _ in range(16):  # the machine changed: 1 thread got slow, the window forgets the old
        cold.record(1, 0.020)
    assert cold.choose() == 2 and cold.faster == 2
    assert "1 threads 20.00 ms per input, 2 threads 9.00 ms per input" == cold.said()


def test_a_gpu_host_is_left_alone() -> None:
    class OnGpu:
        uses_cuda = True

    assert PassThreads.for_adapter(OnGpu()) is None
