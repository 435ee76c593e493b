"""The state a deployment shows, derived from its residencies."""

from __future__ import annotations

import pytest

from gantry.controlplane.deployments.health_rules import (
    ResidencyHealth,
    Settlement,
    plan_settle,
    settled_state,
)
from gantry.controlplane.platform.state_machines import DeploymentState as D
from gantry.controlplane.platform.state_machines import ResidencyState as R


def health(
    state: R,
    *,
    restarting: bool = False,
    usable: bool = True,
    connected: bool = True,
    failure: tuple[str, str] = ("", ""),
):
    return ResidencyHealth(
        state=state,
        restarting=restarting,
        usable_node=usable,
        node_connected=connected,
        failure_reason=failure[0],
        failure_message=failure[1],
    )


@pytest.mark.parametrize(
    ("residencies", "expected"),
    [
        ([health(R.RESIDENT)], D.READY),
        ([health(R.RESIDENT), health(R.LOADING)], D.READY),  # a second replica still loading
        ([health(R.RESIDENT), health(R.LOADING, restarting=True)], D.DEGRADED),
        ([health(R.LOADING, restarting=True)], D.DEGRADED),
        ([health(R.RESIDENT), health(R.UNCERTAIN)], D.DEGRADED),
        ([health(R.RESIDENT, connected=False)], D.DEGRADED),
        ([health(R.LOADING)], D.LOADING),
        ([health(R.COLD)], D.PENDING),
        ([], D.PENDING),
        ([health(R.RESIDENT, usable=False)], D.PENDING),  # only on a disabled node
    ],
)
def test_settled_state_of_a_live_deployment(residencies, expected):
    for current in (D.PENDING, D.LOADING, D.READY, D.DEGRADED):
        assert settled_state(current, residencies) == expected


@pytest.mark.parametrize("current", [D.UNLOADING, D.UNLOADED, D.FAILED])
def test_operator_and_terminal_states_are_never_derived(current):
    assert settled_state(current, [health(R.RESIDENT)]) == current


CRASHED = ("RUNTIME_CRASHED", "exit 9")
LOOPING = ("RUNTIME_CRASH_LOOP", "5 crashes")


def test_settling_a_deployment_already_in_its_state_writes_nothing():
    assert plan_settle(D.READY, "", [health(R.RESIDENT)]) is None
    assert (
        plan_settle(D.DEGRADED, "RUNTIME_CRASHED", [health(R.UNCERTAIN, failure=CRASHED)]) is None
    )


def test_settling_walks_to_the_derived_state_without_a_failure_unless_degraded():
    assert plan_settle(D.PENDING, "", [health(R.RESIDENT)]) == Settlement(
        target=D.READY, failure=None, walk=True
    )
    assert plan_settle(D.READY, "", [health(R.RESIDENT), health(R.UNCERTAIN, failure=CRASHED)]) == (
        Settlement(target=D.DEGRADED, failure=CRASHED, walk=True)
    )


def test_a_degraded_deployment_without_a_recorded_reason_says_a_host_is_restarting():
    assert plan_settle(D.READY, "", [health(R.RESIDENT, connected=False)]) == Settlement(
        target=D.DEGRADED,
        failure=("RUNTIME_CRASHED", "a model host is being restarted"),
        walk=True,
    )


def test_a_crash_loop_wins_over_a_single_crash_and_a_cold_residency_says_nothing():
    residencies = [
        health(R.COLD, failure=("WORKER_UNAVAILABLE", "gone")),
        health(R.LOADING, restarting=True, failure=CRASHED),
        health(R.LOADING, restarting=True, failure=LOOPING),
    ]
    assert plan_settle(D.READY, "", residencies) == Settlement(
        target=D.DEGRADED, failure=LOOPING, walk=True
    )


def test_a_degraded_deployment_with_a_new_reason_records_it_in_place():
    residencies = [health(R.RESIDENT), health(R.LOADING, restarting=True, failure=LOOPING)]
    assert plan_settle(D.DEGRADED, "RUNTIME_CRASHED", residencies) == Settlement(
        target=D.DEGRADED, failure=LOOPING, walk=False
    )
