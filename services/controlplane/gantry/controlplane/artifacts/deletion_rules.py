"""When an artifact set or a node may be deleted: pure rules over what still uses it.

A delete keeps the row (and its history) and only marks it; these rules say whether anything
still depends on the object, and the refusal an operator reads when something does.
"""

from __future__ import annotations

from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.controlplane.platform.state_machines import NodeState, ResidencyState

# Ids named in a refusal's message and metadata; the count says how many there are in all.
SHOWN_IDS = 5

# A node in these states runs nothing and takes no work. REGISTERED: it never connected.
DELETABLE_NODE_STATES = frozenset(
    {NodeState.DISABLED, NodeState.DISCONNECTED, NodeState.REGISTERED}
)


def _shown(ids: Sequence[str]) -> str:
    head = ", ".join(ids[:SHOWN_IDS])
    return head if len(ids) <= SHOWN_IDS else f"{head}, … ({len(ids)} in all)"


def artifact_set_delete_refusal(
    artifact_set_id: str, *, deployment_ids: Sequence[str], open_job_ids: Sequence[str]
) -> GantryError | None:
    """ARTIFACT_SET_IN_USE while a deployment that is not deleted names it, or an inspection or
    probe of it is still open; None when it may be deleted."""
    if deployment_ids:
        return GantryError(
            "ARTIFACT_SET_IN_USE",
            f"artifact set {artifact_set_id} is used by deployment {_shown(deployment_ids)};"
            " unload and delete them first (gantry delete deployment ID)",
            artifact_set_id=artifact_set_id,
            deployment_ids=",".join(deployment_ids[:SHOWN_IDS]),
            deployment_count=str(len(deployment_ids)),
        )
    if open_job_ids:
        return GantryError(
            "ARTIFACT_SET_IN_USE",
            f"artifact set {artifact_set_id} has {len(open_job_ids)} inspection or probe job(s)"
            f" still open ({_shown(open_job_ids)}); wait for them to end, or cancel the probe",
            artifact_set_id=artifact_set_id,
            job_ids=",".join(open_job_ids[:SHOWN_IDS]),
            job_count=str(len(open_job_ids)),
        )
    return None


def node_delete_refusal(
    node_id: str,
    *,
    state: str,
    stream_open: bool,
    warm_residency_ids: Sequence[str],
    open_job_ids: Sequence[str],
) -> GantryError | None:
    """NODE_IN_USE unless the node is disabled or away (or never connected), every residency on
    it is COLD and no job is open on it; None when it may be deleted."""
    drain = f"drain it first: gantry nodes drain {node_id}"
    if state not in DELETABLE_NODE_STATES or (stream_open and state != NodeState.DISABLED):
        return GantryError(
            "NODE_IN_USE",
            f"node {node_id} is {state}; {drain}",
            node_id=node_id,
            state=state,
        )
    if warm_residency_ids:
        return GantryError(
            "NODE_IN_USE",
            f"node {node_id} still holds {len(warm_residency_ids)} residency(ies) that are not"
            f" {ResidencyState.COLD} ({_shown(warm_residency_ids)}); {drain}, and wait until"
            " they are unloaded",
            node_id=node_id,
            state=state,
            residency_ids=",".join(warm_residency_ids[:SHOWN_IDS]),
            residency_count=str(len(warm_residency_ids)),
        )
    if open_job_ids:
        return GantryError(
            "NODE_IN_USE",
            f"node {node_id} has {len(open_job_ids)} job(s) still open ({_shown(open_job_ids)});"
            f" {drain}, and wait until they end",
            node_id=node_id,
            state=state,
            job_ids=",".join(open_job_ids[:SHOWN_IDS]),
            job_count=str(len(open_job_ids)),
        )
    return None
