"""The state a live deployment should show, derived from its residencies. Pure.

READY: every residency that exists is RESIDENT or loading for the first time, and one serves.
DEGRADED: something is wrong but the deployment is still wanted: a host crash-loops, is being
restarted, is UNCERTAIN, or sits on a node whose worker stopped answering. It serves from any
residency still RESIDENT.
LOADING: nothing serves yet and first loads are under way. PENDING: nothing is placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

LIVE_STATES = frozenset(
    {
        DeploymentState.PENDING,
        DeploymentState.LOADING,
        DeploymentState.READY,
        DeploymentState.DEGRADED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyHealth:
    state: ResidencyState
    restarting: bool  # LOADING because its host went away, not a first load
    usable_node: bool  # its node is not disabled
    node_connected: bool  # its node's worker stream is open (heartbeats arrive)


def settled_state(
    current: DeploymentState, residencies: Sequence[ResidencyHealth]
) -> DeploymentState:
    if current not in LIVE_STATES:
        return current
    live = [r for r in residencies if r.state != ResidencyState.COLD and r.usable_node]
    resident = any(r.state == ResidencyState.RESIDENT and r.node_connected for r in live)
    troubled = any(
        r.state == ResidencyState.UNCERTAIN
        or (r.state == ResidencyState.LOADING and r.restarting)
        or (r.state == ResidencyState.RESIDENT and not r.node_connected)
        for r in live
    )
    if resident:
        return DeploymentState.DEGRADED if troubled else DeploymentState.READY
    if troubled:
        return DeploymentState.DEGRADED
    if any(r.state == ResidencyState.LOADING for r in live):
        return DeploymentState.LOADING
    return DeploymentState.PENDING
