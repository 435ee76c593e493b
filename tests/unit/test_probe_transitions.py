"""Every (from, to) pair of the probe table against an expectation written out by hand.

The allowed pairs below are the intended semantics of ARCHITECTURE.md's probe states, listed
independently of `evidence/probe_transitions.py`: a change to the table that is not also made here
fails, and so does a state the table forgets.
"""

from __future__ import annotations

import itertools

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.evidence.probe_transitions import (
    PROBE_TRANSITIONS,
    ProbeState,
    check_probe_transition,
    forward_path,
)

ALLOWED: set[tuple[str, str]] = {
    # The way forward, one stage at a time.
    ("QUEUED", "PREPARING"),
    ("PREPARING", "LOADING"),
    ("LOADING", "HEALTHCHECKING"),
    ("HEALTHCHECKING", "READY"),
    ("READY", "UNLOADING"),
    ("UNLOADING", "COMPLETED"),
    # FAILED and CANCELLED from every state that has not ended.
    ("QUEUED", "FAILED"),
    ("QUEUED", "CANCELLED"),
    ("PREPARING", "FAILED"),
    ("PREPARING", "CANCELLED"),
    ("LOADING", "FAILED"),
    ("LOADING", "CANCELLED"),
    ("HEALTHCHECKING", "FAILED"),
    ("HEALTHCHECKING", "CANCELLED"),
    ("READY", "FAILED"),
    ("READY", "CANCELLED"),
    ("UNLOADING", "FAILED"),
    ("UNLOADING", "CANCELLED"),
    # A lost lease or a worker restart: back to QUEUED, and the job is leased again.
    ("PREPARING", "QUEUED"),
    ("LOADING", "QUEUED"),
    ("HEALTHCHECKING", "QUEUED"),
    ("READY", "QUEUED"),
    ("UNLOADING", "QUEUED"),
    # COMPLETED, FAILED and CANCELLED are terminal.
}

STATE_NAMES = [
    "QUEUED",
    "PREPARING",
    "LOADING",
    "HEALTHCHECKING",
    "READY",
    "UNLOADING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
]


def test_the_expectation_names_exactly_the_probe_states() -> None:
    assert {state.value for state in ProbeState} == set(STATE_NAMES)
    assert {str(state) for state in PROBE_TRANSITIONS} == set(STATE_NAMES)
    assert {state for pair in ALLOWED for state in pair} <= set(STATE_NAMES)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        pytest.param(current, target, id=f"{current}-{target}")
        for current, target in itertools.product(STATE_NAMES, STATE_NAMES)
    ],
)
def test_every_pair_is_allowed_exactly_when_expected(current: str, target: str) -> None:
    if (current, target) in ALLOWED:
        check_probe_transition(current, target)
    else:
        with pytest.raises(GantryError) as caught:
            check_probe_transition(current, target)
        assert caught.value.reason == "INVALID_STATE_TRANSITION"
        assert caught.value.metadata == {"machine": "probe", "current": current, "target": target}


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED"])
def test_an_ended_probe_goes_nowhere(state: str) -> None:
    for target in STATE_NAMES:
        with pytest.raises(GantryError):
            check_probe_transition(state, target)


def test_an_unknown_state_is_a_typed_error_not_a_key_error() -> None:
    with pytest.raises(GantryError) as caught:
        check_probe_transition("SOMEWHERE", "QUEUED")
    assert caught.value.reason == "INVALID_STATE_TRANSITION"


def test_a_result_walks_the_remaining_stages_in_order() -> None:
    assert forward_path("LOADING", "COMPLETED") == [
        ProbeState.HEALTHCHECKING,
        ProbeState.READY,
        ProbeState.UNLOADING,
        ProbeState.COMPLETED,
    ]
    assert forward_path("UNLOADING", "COMPLETED") == [ProbeState.COMPLETED]
    assert forward_path("QUEUED", "COMPLETED")[0] == ProbeState.PREPARING


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("COMPLETED", "COMPLETED"),
        ("FAILED", "COMPLETED"),
        ("CANCELLED", "COMPLETED"),
        ("LOADING", "PREPARING"),  # backwards is never a walk forward
        ("READY", "QUEUED"),  # a requeue is a single checked move, not a walk
    ],
)
def test_no_walk_forward_from_an_end_or_backwards(current: str, target: str) -> None:
    with pytest.raises(GantryError) as caught:
        forward_path(current, target)
    assert caught.value.reason == "INVALID_STATE_TRANSITION"
