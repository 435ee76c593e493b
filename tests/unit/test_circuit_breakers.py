"""Circuit breakers per (node, deployment) and per node, driven by a fake time."""

from __future__ import annotations

import itertools

import pytest

from gantry.common.errors import GantryError
from gantry.scheduler.policy.breakers import (
    TRANSITIONS,
    BreakerBoard,
    BreakerChange,
    BreakerEvent,
    BreakerView,
    transition,
)
from gantry.scheduler.policy.types import BreakerState, Outcome

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
INFRA, SUCCESS = Outcome.INFRA_FAILURE, Outcome.SUCCESS


def _open_pair(board: BreakerBoard, now: float = 0.0) -> None:
    for _ in range(3):
        board.record("n1", "d1", INFRA, now)
    assert board.state("n1", "d1") is OPEN


@pytest.mark.parametrize(("state", "event"), list(itertools.product(BreakerState, BreakerEvent)))
def test_every_state_and_event_pair_is_in_the_table_or_refused(state, event):
    if (state, event) in TRANSITIONS:
        assert transition(state, event) is TRANSITIONS[(state, event)]
        return
    with pytest.raises(GantryError) as refused:
        transition(state, event)
    assert refused.value.reason == "INVALID_STATE_TRANSITION"
    assert refused.value.metadata == {"state": state.name, "event": event.name}


def test_three_consecutive_infra_failures_open_the_pair_breaker():
    board = BreakerBoard()
    assert board.record("n1", "d1", INFRA, 0.0) == []
    assert board.record("n1", "d1", INFRA, 1.0) == []
    changes = board.record("n1", "d1", INFRA, 2.0)
    # The node's own breaker counted the same three failures.
    assert changes == [
        BreakerChange("n1", "d1", OPEN, 3),
        BreakerChange("n1", "", OPEN, 3),
    ]
    assert not board.allows("n1", "d1", 2.0)


def test_two_failures_then_a_success_start_the_count_again():
    board = BreakerBoard()
    board.record("n1", "d1", INFRA, 0.0)
    board.record("n1", "d1", INFRA, 1.0)
    assert board.record("n1", "d1", SUCCESS, 2.0) == []
    board.record("n1", "d1", INFRA, 3.0)
    board.record("n1", "d1", INFRA, 4.0)
    assert board.state("n1", "d1") is CLOSED and board.allows("n1", "d1", 4.0)
    assert [view.consecutive_failures for view in board.views(4.0)] == [2, 2]


def test_request_failures_never_open_a_breaker():
    board = BreakerBoard()
    for second in range(20):
        assert board.record("n1", "d1", Outcome.REQUEST_FAILURE, float(second)) == []
    board.record("n1", "d1", INFRA, 20.0)
    board.record("n1", "d1", INFRA, 21.0)
    # The runtime answered in between, so the infra failures around it are not consecutive.
    board.record("n1", "d1", Outcome.REQUEST_FAILURE, 22.0)
    board.record("n1", "d1", INFRA, 23.0)
    assert board.state("n1", "d1") is CLOSED and board.state("n1") is CLOSED


def test_cancelled_calls_neither_count_nor_reset():
    board = BreakerBoard()
    board.record("n1", "d1", INFRA, 0.0)
    board.record("n1", "d1", INFRA, 1.0)
    assert board.record("n1", "d1", Outcome.CANCELLED, 2.0) == []
    board.record("n1", "d1", INFRA, 3.0)
    assert board.state("n1", "d1") is OPEN


def test_after_the_cooldown_exactly_one_probe_goes_through_and_its_success_closes_it():
    board = BreakerBoard(cooldown_seconds=30.0)
    _open_pair(board, now=0.0)
    assert board.tick(29.9) == []
    assert board.views(29.9)[0].cooldown_left == pytest.approx(0.1)
    assert board.tick(30.0) == [
        BreakerChange("n1", "", HALF_OPEN, 3),
        BreakerChange("n1", "d1", HALF_OPEN, 3),
    ]
    assert board.allows("n1", "d1", 30.0)
    board.started("n1", "d1", 30.0)
    assert not board.allows("n1", "d1", 30.5)  # the one probe is out
    changes = board.record("n1", "d1", SUCCESS, 31.0)
    assert changes == [BreakerChange("n1", "d1", CLOSED, 0), BreakerChange("n1", "", CLOSED, 0)]
    assert board.allows("n1", "d1", 31.0) and board.views(31.0) == []


def test_a_failed_probe_reopens_the_breaker_with_a_fresh_cooldown():
    board = BreakerBoard(cooldown_seconds=30.0)
    _open_pair(board, now=0.0)
    board.tick(30.0)
    board.started("n1", "d1", 30.0)
    changes = board.record("n1", "d1", INFRA, 35.0)
    assert changes == [BreakerChange("n1", "d1", OPEN, 4), BreakerChange("n1", "", OPEN, 4)]
    assert board.tick(64.9) == []
    assert {change.state for change in board.tick(65.0)} == {HALF_OPEN}


def test_a_probe_ending_in_a_request_failure_proves_the_runtime_answered():
    board = BreakerBoard()
    _open_pair(board)
    board.tick(30.0)
    board.started("n1", "d1", 30.0)
    board.record("n1", "d1", Outcome.REQUEST_FAILURE, 31.0)
    assert board.state("n1", "d1") is CLOSED and board.state("n1") is CLOSED


def test_a_cancelled_probe_frees_the_slot_for_another():
    board = BreakerBoard()
    _open_pair(board)
    board.tick(30.0)
    board.started("n1", "d1", 30.0)
    assert not board.allows("n1", "d1", 30.0)
    assert board.record("n1", "d1", Outcome.CANCELLED, 31.0) == []
    assert board.state("n1", "d1") is HALF_OPEN and board.allows("n1", "d1", 31.0)


def test_a_late_success_while_open_does_not_cut_the_cooldown_short():
    board = BreakerBoard()
    _open_pair(board)
    assert board.record("n1", "d1", SUCCESS, 5.0) == []
    assert board.state("n1", "d1") is OPEN and not board.allows("n1", "d1", 5.0)


def test_the_node_breaker_opens_on_failures_across_its_deployments():
    board = BreakerBoard()
    board.record("n1", "d1", INFRA, 0.0)
    board.record("n1", "d2", INFRA, 1.0)
    changes = board.record("n1", "d3", INFRA, 2.0)
    assert changes == [BreakerChange("n1", "", OPEN, 3)]
    assert all(board.state("n1", d) is CLOSED for d in ("d1", "d2", "d3"))
    assert not board.allows("n1", "d4", 2.0)  # a deployment that never failed there
    assert board.allows("n2", "d1", 2.0)


def test_views_list_only_breakers_not_at_rest_with_their_cooldown():
    board = BreakerBoard(cooldown_seconds=30.0)
    _open_pair(board, now=10.0)
    board.record("n2", "d1", INFRA, 10.0)
    assert board.views(20.0) == [
        BreakerView("n1", "", OPEN, 3, 20.0),
        BreakerView("n1", "d1", OPEN, 3, 20.0),
        BreakerView("n2", "", CLOSED, 1, 0.0),
        BreakerView("n2", "d1", CLOSED, 1, 0.0),
    ]


def test_forget_drops_one_pair_or_a_whole_node():
    board = BreakerBoard()
    _open_pair(board)
    board.record("n1", "d2", INFRA, 0.0)
    board.forget("n1", "d1")
    assert board.state("n1", "d1") is CLOSED and board.state("n1") is OPEN
    board.forget("n1")
    assert board.views(0.0) == [] and board.allows("n1", "d2", 0.0)


def test_a_threshold_below_one_is_refused():
    with pytest.raises(GantryError):
        BreakerBoard(threshold=0)


def test_forgetting_a_deployment_drops_its_breaker_on_every_node_and_keeps_the_nodes():
    board = BreakerBoard()
    for node_id in ("n1", "n2"):
        board.record(node_id, "d1", INFRA, 0.0)
    board.record("n1", "d2", INFRA, 0.0)
    board.forget_deployment("d1")
    assert [(v.node_id, v.deployment_id) for v in board.views(0.0)] == [
        ("n1", ""),
        ("n1", "d2"),
        ("n2", ""),
    ]
    board.forget_deployment("")  # the nodes' own breakers are no deployment's
    assert len(board.views(0.0)) == 3
