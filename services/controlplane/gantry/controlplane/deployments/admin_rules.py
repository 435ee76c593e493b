"""When an operator may delete, restart or scale a deployment: pure rules and their refusals.

Each rule takes what was read of the deployment and returns the typed refusal an operator reads
(with what to do instead), or None when the operation may go ahead.
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import GantryError, invalid_argument
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

# Ids named in a refusal's message and metadata.
SHOWN_IDS = 5

# Nothing runs and nothing will by itself: deleting forgets nothing that still serves.
DELETABLE_STATES = frozenset({DeploymentState.UNLOADED, DeploymentState.FAILED})

# Every state but UNLOADING: an unload under way finishes first (it is the operator's own
# request, and its residencies' custody ends with their UNLOAD jobs).
RESTARTABLE_STATES = frozenset(
    {
        DeploymentState.PENDING,
        DeploymentState.LOADING,
        DeploymentState.READY,
        DeploymentState.DEGRADED,
        DeploymentState.FAILED,
        DeploymentState.UNLOADED,
    }
)

# Only a deployment that is wanted: a stopped one is brought back by a restart, not a scale.
SCALABLE_STATES = LIVE_STATES


def delete_refusal(
    deployment_id: str, *, state: str, warm_residency_ids: Sequence[str]
) -> GantryError | None:
    """DEPLOYMENT_IN_USE unless UNLOADED or FAILED with every residency COLD."""
    unload = f"unload it first: gantry unload {deployment_id}"
    if state not in DELETABLE_STATES:
        return GantryError(
            "DEPLOYMENT_IN_USE",
            f"deployment {deployment_id} is {state}; {unload}",
            deployment_id=deployment_id,
            state=state,
        )
    if warm_residency_ids:
        return GantryError(
            "DEPLOYMENT_IN_USE",
            f"deployment {deployment_id} still has {len(warm_residency_ids)} residency(ies) that"
            f" are not {ResidencyState.COLD} ({', '.join(warm_residency_ids[:SHOWN_IDS])});"
            f" {unload}, and wait until they are unloaded",
            deployment_id=deployment_id,
            state=state,
            residency_ids=",".join(warm_residency_ids[:SHOWN_IDS]),
            residency_count=str(len(warm_residency_ids)),
        )
    return None


def restart_refusal(deployment_id: str, *, state: str) -> GantryError | None:
    if state in RESTARTABLE_STATES:
        return None
    return GantryError(
        "INVALID_STATE_TRANSITION",
        f"deployment {deployment_id} is {state}; wait until it is {DeploymentState.UNLOADED},"
        f" then restart it",
        machine="deployment",
        current=state,
        target=str(DeploymentState.PENDING),
    )


def adopted_refusal(deployment_id: str, *, origin: str, operation: str) -> GantryError | None:
    """An adopted deployment is its external server: Gantry never starts or places another
    replica of it, so it is neither restarted nor scaled (adopt the server again instead)."""
    if origin != "adopted":
        return None
    return GantryError(
        "INVALID_STATE_TRANSITION",
        f"deployment {deployment_id} is an adopted endpoint and is never {operation}; unload or "
        "delete it, and adopt the server again (gantry endpoints adopt)",
        machine="deployment",
        deployment_id=deployment_id,
        origin=origin,
    )


def scale_refusal(deployment_id: str, *, state: str) -> GantryError | None:
    if state in SCALABLE_STATES:
        return None
    return GantryError(
        "DEPLOYMENT_NOT_SERVING",
        f"deployment {deployment_id} is {state} and is not scaled; bring it back first:"
        f" gantry restart {deployment_id}",
        deployment_id=deployment_id,
        state=state,
    )


def check_scale_replicas(replicas: int) -> int:
    """A scale names the replicas wanted; 0 would mean "stop serving", which an unload says."""
    if replicas < 1:
        raise invalid_argument(
            "replicas must be at least 1; to stop serving, unload it (gantry unload ID)",
            field="replicas",
        )
    return replicas
