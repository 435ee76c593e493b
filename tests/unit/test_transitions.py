"""Every (from, to) pair of every state machine against an expectation written out by hand.

The allowed pairs below are the intended semantics, listed independently of
`platform/state_machines.py`: a change to a table that is not also made here fails, and so does a
state that a table forgets.
"""

from __future__ import annotations

import enum
import itertools

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.platform.state_machines import (
    MACHINES,
    DeploymentState,
    JobState,
    NodeState,
    ResidencyState,
    check_transition,
    shortest_path,
)

STATES: dict[str, type[enum.StrEnum]] = {
    "residency": ResidencyState,
    "job": JobState,
    "deployment": DeploymentState,
    "node": NodeState,
}

ALLOWED: dict[str, set[tuple[str, str]]] = {
    "residency": {
        ("COLD", "LOADING"),
        ("LOADING", "RESIDENT"),
        ("LOADING", "COLD"),
        ("LOADING", "UNCERTAIN"),
        ("LOADING", "UNLOADING"),
        ("RESIDENT", "DRAINING"),
        ("RESIDENT", "UNLOADING"),
        ("RESIDENT", "COLD"),
        ("RESIDENT", "UNCERTAIN"),
        ("RESIDENT", "LOADING"),  # its host crashed; the worker restarts it in place
        ("DRAINING", "UNLOADING"),
        ("DRAINING", "COLD"),
        ("DRAINING", "UNCERTAIN"),
        ("UNLOADING", "COLD"),
        ("UNLOADING", "UNCERTAIN"),
        ("UNCERTAIN", "UNLOADING"),
        ("UNCERTAIN", "COLD"),
    },
    "job": {
        ("QUEUED", "LEASED"),
        ("QUEUED", "CANCELLED"),
        ("QUEUED", "FAILED"),
        ("LEASED", "RUNNING"),
        ("LEASED", "SUCCEEDED"),
        ("LEASED", "FAILED"),
        ("LEASED", "CANCELLED"),
        ("LEASED", "QUEUED"),  # lease expired, or its generation died, before the work started
        ("RUNNING", "SUCCEEDED"),
        ("RUNNING", "FAILED"),
        ("RUNNING", "CANCELLED"),
        ("RUNNING", "QUEUED"),
        # SUCCEEDED, FAILED and CANCELLED are terminal.
    },
    "deployment": {
        ("PENDING", "LOADING"),
        ("PENDING", "FAILED"),
        ("PENDING", "UNLOADING"),
        ("PENDING", "UNLOADED"),
        ("LOADING", "READY"),
        ("LOADING", "FAILED"),
        ("LOADING", "PENDING"),
        ("LOADING", "UNLOADING"),
        ("LOADING", "DEGRADED"),  # some replicas serve, others did not load
        ("READY", "UNLOADING"),
        ("READY", "PENDING"),  # its only residency was lost and waits to be re-placed
        ("READY", "FAILED"),
        ("READY", "DEGRADED"),
        ("DEGRADED", "READY"),
        ("DEGRADED", "UNLOADING"),
        ("DEGRADED", "PENDING"),
        ("DEGRADED", "FAILED"),
        ("UNLOADING", "UNLOADED"),
        ("UNLOADING", "FAILED"),
        ("FAILED", "UNLOADING"),
        ("FAILED", "UNLOADED"),
        ("FAILED", "PENDING"),  # an operator's restart
        ("UNLOADED", "PENDING"),  # an operator's restart; nothing else leaves UNLOADED
    },
    "node": {
        ("REGISTERED", "CONNECTED"),
        ("REGISTERED", "DISABLED"),
        ("CONNECTED", "DISCONNECTED"),
        ("CONNECTED", "DISABLED"),
        ("DISCONNECTED", "CONNECTED"),
        ("DISCONNECTED", "DISABLED"),
        ("DISABLED", "DISCONNECTED"),  # enabled again; DISCONNECTED until its worker connects
    },
}

PAIRS = [
    pytest.param(machine, current.value, target.value, id=f"{machine}-{current}-{target}")
    for machine, states in STATES.items()
    for current, target in itertools.product(states, states)
]


def test_the_expectation_names_only_real_states_and_every_machine() -> None:
    assert set(ALLOWED) == set(STATES) == set(MACHINES)
    for machine, pairs in ALLOWED.items():
        names = {state.value for state in STATES[machine]}
        assert {state for pair in pairs for state in pair} <= names, machine


@pytest.mark.parametrize("machine", list(STATES))
def test_every_state_has_a_row_in_its_table(machine: str) -> None:
    assert {str(state) for state in MACHINES[machine]} == {s.value for s in STATES[machine]}


@pytest.mark.parametrize(("machine", "current", "target"), PAIRS)
def test_every_pair_is_allowed_exactly_when_expected(
    machine: str, current: str, target: str
) -> None:
    if (current, target) in ALLOWED[machine]:
        check_transition(machine, current, target)
    else:
        with pytest.raises(GantryError) as caught:
            check_transition(machine, current, target)
        assert caught.value.reason == "INVALID_STATE_TRANSITION"
        assert caught.value.metadata == {"machine": machine, "current": current, "target": target}


def test_residency_lifecycle_from_the_design_is_reachable() -> None:
    path = ["COLD", "LOADING", "RESIDENT", "DRAINING", "UNLOADING", "COLD"]
    for current, target in itertools.pairwise(path):
        check_transition("residency", current, target)


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED", "CANCELLED"])
def test_terminal_job_states_go_nowhere(state: str) -> None:
    for target in JobState:
        with pytest.raises(GantryError):
            check_transition("job", state, target.value)


def test_an_unknown_state_is_a_typed_error_not_a_key_error() -> None:
    with pytest.raises(GantryError) as caught:
        check_transition("deployment", "SOMEWHERE", "READY")
    assert caught.value.reason == "INVALID_STATE_TRANSITION"


@pytest.mark.parametrize("stopped", ["UNLOADED", "FAILED", "UNLOADING"])
def test_no_derived_walk_brings_a_stopped_deployment_back(stopped: str) -> None:
    # Only RestartDeployment's single checked step leaves UNLOADED or FAILED for PENDING.
    for target in ("PENDING", "LOADING", "READY", "DEGRADED"):
        with pytest.raises(GantryError):
            shortest_path("deployment", stopped, target)
