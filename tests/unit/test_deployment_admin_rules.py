"""Which deployments an operator may delete, restart and scale, and the refusals they read."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.admin_rules import (
    check_scale_replicas,
    delete_refusal,
    restart_refusal,
    scale_refusal,
)
from gantry.controlplane.platform.state_machines import DeploymentState, check_transition

ALL = list(DeploymentState)


@pytest.mark.parametrize("state", ALL)
def test_only_an_unloaded_or_failed_deployment_may_be_deleted(state: DeploymentState) -> None:
    refusal = delete_refusal("d-1", state=state, warm_residency_ids=[])
    if state in (DeploymentState.UNLOADED, DeploymentState.FAILED):
        assert refusal is None
    else:
        assert refusal is not None and refusal.reason == "DEPLOYMENT_IN_USE"
        assert refusal.metadata["state"] == state
        assert "gantry unload d-1" in refusal.message


def test_a_failed_deployment_with_a_warm_residency_is_still_in_use() -> None:
    refusal = delete_refusal("d-1", state="FAILED", warm_residency_ids=["r-1", "r-2"])
    assert refusal is not None and refusal.reason == "DEPLOYMENT_IN_USE"
    assert refusal.metadata["residency_ids"] == "r-1,r-2"


@pytest.mark.parametrize("state", ALL)
def test_every_state_but_unloading_restarts_through_a_table_transition(
    state: DeploymentState,
) -> None:
    refusal = restart_refusal("d-1", state=state)
    if state == DeploymentState.UNLOADING:
        assert refusal is not None and refusal.reason == "INVALID_STATE_TRANSITION"
        assert refusal.metadata["current"] == "UNLOADING"
    else:
        assert refusal is None
        if state != DeploymentState.PENDING:
            check_transition("deployment", state, DeploymentState.PENDING)  # the table agrees


@pytest.mark.parametrize("state", ALL)
def test_only_a_live_deployment_is_scaled(state: DeploymentState) -> None:
    refusal = scale_refusal("d-1", state=state)
    live = {"PENDING", "LOADING", "READY", "DEGRADED"}
    assert (refusal is None) == (state in live)
    if refusal is not None:
        assert refusal.reason == "DEPLOYMENT_NOT_SERVING"
        assert "gantry restart d-1" in refusal.message


def test_zero_replicas_is_refused_naming_the_field_and_the_unload() -> None:
    with pytest.raises(GantryError) as caught:
        check_scale_replicas(0)
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata == {"field": "replicas"}
    assert "unload" in caught.value.message
    assert check_scale_replicas(3) == 3
