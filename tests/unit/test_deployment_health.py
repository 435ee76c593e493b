"""The state a deployment shows, derived from its residencies."""

from __future__ import annotations

import pytest

from gantry.controlplane.deployments.health_rules import ResidencyHealth, settled_state
from gantry.controlplane.platform.state_machines import DeploymentState as D
from gantry.controlplane.platform.state_machines import ResidencyState as R


def health(state: R, *, restarting: bool = False, usable: bool = True, connected: bool = True):
    return ResidencyHealth(
        state=state, restarting=restarting, usable_node=usable, node_connected=connected
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
