"""The state a live deployment should show, derived from its residencies. Pure.

READY: every residency that exists is RESIDENT or loading for the first time, and one serves.
DEGRADED: something is wrong but the deployment is still wanted: a host crash-loops, is being
restarted, is UNCERTAIN, or sits on a node whose worker stopped answering. It serves from any
residency still RESIDENT.
LOADING: nothing serves yet and first loads are under way. PENDING: nothing is placed.
`plan_settle` turns that into the one write settle.py makes, with the reason the deployment shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gantry.controlplane.nodes.inventory_rules import CRASH_LOOP
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
    failure_reason: str = ""  # the residency's last failure, and its message
    failure_message: str = ""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """The write that settles a deployment: `walk` moves it along the table's shortest path to
    `target` (the failure on the last step); otherwise it stays in `target` (its state) and only
    the failure it shows changes."""

    target: DeploymentState
    failure: tuple[str, str] | None
    walk: bool


def plan_settle(
    current: DeploymentState, shown_reason: str, residencies: Sequence[ResidencyHealth]
) -> Settlement | None:
    """What settling a deployment in `current`, showing `shown_reason`, writes; None: nothing."""
    reason, message = worst_failure(residencies)
    target = settled_state(current, residencies)
    if target == current == DeploymentState.DEGRADED and reason and reason != shown_reason:
        # Still degraded, for a worse (or another) reason: say which.
        return Settlement(target=target, failure=(reason, message), walk=False)
    if target == current:
        return None
    if target != DeploymentState.DEGRADED:
        return Settlement(target=target, failure=None, walk=True)
    if not reason:
        reason, message = "RUNTIME_CRASHED", "a model host is being restarted"
    return Settlement(target=target, failure=(reason, message), walk=True)


def worst_failure(residencies: Sequence[ResidencyHealth]) -> tuple[str, str]:
    """(reason, message) a deployment shows: of the first residency (not COLD) with a failure,
    unless another crash-loops: a crash loop wins over a single crash."""
    reason, message = "", ""
    for residency in residencies:
        if residency.failure_reason and residency.state != ResidencyState.COLD:
            if not reason or residency.failure_reason == CRASH_LOOP:
                reason, message = residency.failure_reason, residency.failure_message
    return reason, message
