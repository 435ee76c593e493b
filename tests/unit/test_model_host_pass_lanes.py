"""model_host/pass_lanes.py: a CPU host under load runs two embed batches side by side, each on
half its threads, never more than two at once; a lone call on an idle host stays on the serving
loop's thread."""

from __future__ import annotations

import logging
import threading

import pytest

from gantry.worker.model_host.pass_lanes import (
    LANES,
    PassLanes,
    lane_batch_inputs,
    lane_threads,
    least_beside_inputs,
    use_lane,
)

# A bound on waits that only a broken lane would reach: the failure's deadline, not a pause.
STUCK_S = 30.0


def test_a_batch_of_several_callers_or_any_batch_beside_a_running_pass_takes_a_lane() -> None:
    assert not use_lane(requests=1, running=0)  # a lone call on an idle host: all its threads
    assert use_lane(requests=2, running=0)
    assert use_lane(requests=1, running=1)
    assert use_lane(requests=5, running=LANES)


@pytest.mark.parametrize(("threads", "each"), [(1, 1), (2, 1), (3, 1), (16, 8)])
def test_each_lane_runs_on_an_equal_share_of_the_host_s_threads(threads: int, each: int) -> None:
    assert lane_threads(threads) == each


@pytest.mark.parametrize(("bound", "each"), [(32, 16), (8, 4), (3, 1), (1, 1)])
def test_the_lanes_together_hold_no_more_inputs_than_the_batch_bound(bound: int, each: int) -> None:
    assert lane_batch_inputs(bound) == each
    assert each * LANES <= max(bound, LANES)


@pytest.mark.parametrize(("bound", "least"), [(32, 8), (8, 2), (4, 2), (2, 1), (1, 1)])
def test_a_batch_beside_a_running_pass_needs_half_a_lane_s_inputs(bound: int, least: int) -> None:
    # Fewer wait for company or the pass's end (serving.py): a pass of 1 on one thread spent 3x
    # the CPU per sentence of a pass of 16.
    assert least_beside_inputs(bound) == least


def test_two_batches_run_at_once_on_lanes_set_to_their_share_of_threads() -> None:
    set_to: list[int] = []
    lanes = PassLanes(threads=2, set_threads=set_to.append)
    # Each batch waits for the other to be running too: on one lane at a time they would not
    # both get past the barrier (it breaks after STUCK_S, and the batch records that).
    both_running = threading.Barrier(LANES, timeout=STUCK_S)
    met: list[bool] = []

    def batch() -> None:
        try:
            both_running.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)

    lanes.submit(batch)
    lanes.submit(batch)
    lanes.wait_idle()
    assert met == [True, True]
    assert set_to == [1, 1]  # each lane's thread, once, as it started
    assert lanes.running == 0
    lanes.close()


def test_a_third_batch_waits_for_a_free_lane() -> None:
    lanes = PassLanes(threads=2, set_threads=lambda _: None)
    events: list[str] = []
    record = threading.Lock()
    release = [threading.Event() for _ in range(LANES)]
    started = [threading.Event() for _ in range(LANES)]

    def held(index: int) -> None:
        started[index].set()
        assert release[index].wait(STUCK_S)
        with record:
            events.append(f"released {index}")

    def third() -> None:
        with record:
            events.append("third ran")

    for index in range(LANES):
        lanes.submit(lambda index=index: held(index))  # type: ignore[misc]
    assert all(event.wait(STUCK_S) for event in started)
    assert lanes.running == LANES
    submitter = threading.Thread(target=lanes.submit, args=(third,))
    submitter.start()
    release[0].set()
    submitter.join(STUCK_S)
    release[1].set()
    lanes.wait_idle()
    # Both lanes were held until the first was let go: the third ran on the lane that freed.
    assert events.index("released 0") < events.index("third ran")
    assert sorted(events) == ["released 0", "released 1", "third ran"]
    lanes.close()


def test_a_batch_that_raises_is_logged_and_frees_its_lane(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lanes = PassLanes(threads=2, set_threads=lambda _: None)
    ended: list[str] = []
    lanes.on_pass_end(lambda: ended.append("pass ended"))

    def broken() -> None:
        raise RuntimeError("not answered by the batch itself")

    with caplog.at_level(logging.ERROR, logger="gantry.model_host"):
        lanes.submit(broken)
        lanes.wait_idle()
    assert lanes.running == 0
    assert ended == ["pass ended"]  # the host's idle clock hears of it too
    assert "a pass lane's batch failed" in caplog.text
    assert "not answered by the batch itself" in caplog.text
    lanes.close()


class _Adapter:
    def __init__(self, *, concurrent_passes: bool, uses_cuda: bool = False) -> None:
        self.concurrent_passes = concurrent_passes
        self.uses_cuda = uses_cuda


def test_no_lanes_for_an_adapter_that_does_not_allow_them_or_one_on_a_gpu() -> None:
    assert PassLanes.for_adapter(_Adapter(concurrent_passes=False)) is None
    assert PassLanes.for_adapter(_Adapter(concurrent_passes=True, uses_cuda=True)) is None
