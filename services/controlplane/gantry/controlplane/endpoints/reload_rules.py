"""When an adopted endpoint's LOAD is issued again, and where. Pure: no IO, no clock.

An adopted deployment is never placed (placement.missing_replicas): its one residency is pinned
to the node its server runs on. That residency goes COLD when its worker restarts (a new
generation holds nothing), stays away past the absence grace, or finds the server down at LOAD.
While the deployment is still wanted, the same node's worker is asked to adopt it again, once that
node is connected: never another node (the server is not there), never after the operator
unloaded or deleted it, and never while a job for it is still open (its result decides first).
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState


@dataclass(frozen=True, slots=True, kw_only=True)
class AdoptedResidencyFacts:
    deployment_state: DeploymentState
    deployment_deleted: bool
    residency_state: ResidencyState
    node_state: NodeState
    node_stream_open: bool  # its worker's stream is open on this control plane
    open_job: bool  # a LOAD or UNLOAD for the residency is queued, leased or running


def reload_wanted(facts: AdoptedResidencyFacts) -> bool:
    """Whether the endpoint's own node should get a new LOAD for it now."""
    return (
        facts.deployment_state in LIVE_STATES  # UNLOADING/UNLOADED: the operator let it go
        and not facts.deployment_deleted
        and facts.residency_state == ResidencyState.COLD
        and facts.node_state == NodeState.CONNECTED  # DISABLED: the operator's choice, too
        and facts.node_stream_open
        and not facts.open_job
    )
