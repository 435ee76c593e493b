"""The reconciler's decisions, one `plan_*` per step that writes. Pure: no IO, no clock.

deployments/reconciler.py reads each step's snapshot in the step's transaction, asks the plan,
and applies the returned actions (jobs/actions.py) with jobs/executor.py in that same
transaction; what to announce (domain events), close or wake stays in the step. Backoff is the
reconciler's own memory, not the database's: a snapshot carries whether a key is due, and the
step records the attempts its plan made.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from gantry.controlplane.deployments.drain_rules import (
    DRAIN_SETTLE_S,
    DrainingResidency,
    DrainVerdict,
    drain_verdict,
)
from gantry.controlplane.endpoints.reload_rules import AdoptedResidencyFacts, reload_wanted
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.nodes.liveness import Heard
from gantry.controlplane.platform.state_machines import NodeState, ResidencyState

NODE_LOST = "WORKER_UNAVAILABLE"

# ---- 2. stale nodes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StaleCandidate:
    """A node that may have gone silent: named by liveness (`heard` set), or by its row's old
    `last_seen_at` (`heard` None). Liveness facts are read after the rows."""

    node_id: str
    state: NodeState
    generation: int
    last_seen_at: dt.datetime | None
    heard: Heard | None
    last_heard: Heard | None  # the last heartbeat liveness holds for the node now
    tracked: bool  # its stream is open here, so liveness (not the row) knows when it was heard


def plan_disconnect(candidate: StaleCandidate) -> tuple[act.DisconnectNode, ...]:
    """DISCONNECTED when the candidate is still stale (nothing otherwise)."""
    if not is_stale(candidate):
        return ()
    heard = candidate.heard
    return (
        act.DisconnectNode(
            node_id=candidate.node_id,
            last_seen_at=None if heard is None else _latest(candidate.last_seen_at, heard),
            heard=heard,
        ),
    )


def is_stale(candidate: StaleCandidate) -> bool:
    """Whether to disconnect a CONNECTED-looking node now.

    `heard` is set when liveness named the stream silent: it still holds only if the row is that
    generation's and no heartbeat came in since (the checks in between awaited the database).
    Without it the row's `last_seen_at` was old, which decides only for a node whose stream is
    not here: for one that is, that time may merely not be flushed yet.
    """
    if candidate.state != NodeState.CONNECTED:
        return False  # already disconnected (this pass or a goodbye), or disabled
    if candidate.heard is not None:
        return (
            candidate.generation == candidate.heard.generation
            and candidate.last_heard == candidate.heard
        )
    return not candidate.tracked


def _latest(last_seen_at: dt.datetime | None, heard: Heard) -> dt.datetime:
    """The later of the row's `last_seen_at` and the last heartbeat heard here."""
    if last_seen_at is None:
        return heard.heard_at
    return max(last_seen_at, heard.heard_at)


# ---- 3. absent nodes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyJobs:
    residency_id: str
    deployment_id: str
    state: ResidencyState
    open_job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AbsentNode:
    """A DISCONNECTED or DISABLED node not seen for the absence grace, and its residencies."""

    node_id: str
    last_seen_at: dt.datetime | None
    stream_open: bool  # a disabled node whose worker is still connected is not absent
    residencies: tuple[ResidencyJobs, ...]


# A cut before every node's last sighting: no node is absent.
NONE_ABSENT = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def absence_cut(now: dt.datetime, *, grace_s: float, hearing_since: dt.datetime) -> dt.datetime:
    """A node last seen before the returned time is absent: not heard for the grace, where a
    sighting before `hearing_since` (when this control plane began to listen) counts as one then,
    since its worker had nowhere to send meanwhile. Until the grace has passed since then, none."""
    cut = now - dt.timedelta(seconds=grace_s)
    return cut if cut >= hearing_since else NONE_ABSENT


def plan_forget_absent(absent: Sequence[AbsentNode]) -> tuple[act.Action, ...]:
    """Its inspections and probes FAIL, and each residency not COLD yet loses its jobs, goes
    COLD (WORKER_UNAVAILABLE) and is audited as lost; its deployment is settled."""
    planned: list[act.Action] = []
    for node in absent:
        if node.stream_open:
            continue
        message = f"node {node.node_id} absent since {node.last_seen_at}"
        # Its inspections and probes will not come back: they end as FAILED, never wait.
        planned.append(
            act.AbandonPipelineJobs(node_id=node.node_id, reason=NODE_LOST, message=message)
        )
        for residency in node.residencies:
            if residency.state == ResidencyState.COLD:
                continue
            planned.extend(act.CancelJob(job_id=job_id) for job_id in residency.open_job_ids)
            planned.append(act.mark_cold(residency.residency_id, reason=NODE_LOST, message=message))
            planned.append(act.Settle(deployment_id=residency.deployment_id))
            planned.append(
                act.Audit(
                    actor="reconciler",
                    action="residency.lost",
                    subject_kind="residency",
                    subject_id=residency.residency_id,
                    detail=(("node_id", node.node_id),),
                )
            )
    return tuple(planned)


# ---- 5. adopted endpoints -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AdoptedResidency:
    deployment_id: str
    residency_id: str
    node_id: str
    state: ResidencyState
    facts: AdoptedResidencyFacts | None  # read for a COLD one only
    due: bool  # its reload backoff allows another LOAD now


def awaiting_reload(residencies: Sequence[AdoptedResidency]) -> set[str]:
    """COLD, or LOADING on the way back: a backoff key is kept until the endpoint is RESIDENT
    again, so a LOAD that fails resumes the backoff instead of starting it over."""
    return {
        r.residency_id
        for r in residencies
        if r.state in (ResidencyState.COLD, ResidencyState.LOADING)
    }


def plan_reload_adopted(residencies: Sequence[AdoptedResidency]) -> tuple[act.Action, ...]:
    """A new LOAD (and a settle) for each COLD adopted endpoint that is wanted and due."""
    planned: list[act.Action] = []
    for residency in residencies:
        if residency.state != ResidencyState.COLD or residency.facts is None:
            continue
        if not reload_wanted(residency.facts) or not residency.due:
            continue
        planned.append(
            act.QueueLoad(
                deployment_id=residency.deployment_id,
                residency_id=residency.residency_id,
                node_id=residency.node_id,
            )
        )
        planned.append(act.Settle(deployment_id=residency.deployment_id))
    return tuple(planned)


# ---- 6. uncertain residencies ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UncertainResidency:
    residency_id: str
    node_id: str
    stream_open: bool  # its worker is connected here
    open_job: bool  # an UNLOAD (or any job) for it is still open
    due: bool  # its unload backoff allows another try now


def plan_retry_uncertain(uncertain: Sequence[UncertainResidency]) -> tuple[act.QueueUnload, ...]:
    """Another UNLOAD for each UNCERTAIN residency whose worker is here, with none open, when
    its backoff is due."""
    return tuple(
        act.QueueUnload(residency_id=r.residency_id, node_id=r.node_id)
        for r in uncertain
        if r.stream_open and not r.open_job and r.due
    )


# ---- 7. draining residencies ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """The writes that end drains, the drains that end (their UNLOAD jobs are dispatched after
    the commit), and those whose calls still in flight are cut (DRAIN_DEADLINE_EXCEEDED)."""

    actions: tuple[act.Action, ...] = ()
    ended: tuple[DrainingResidency, ...] = ()
    cut: tuple[DrainingResidency, ...] = ()


def plan_finish_drains(
    draining: Sequence[DrainingResidency], *, now: dt.datetime, settle_s: float = DRAIN_SETTLE_S
) -> DrainPlan:
    """UNLOADING with an UNLOAD job (its deployment settled, the drain audited) for each
    draining residency that is idle or past its deadline; the others wait."""
    planned: list[act.Action] = []
    ended: list[DrainingResidency] = []
    cut: list[DrainingResidency] = []
    for residency in draining:
        verdict = drain_verdict(residency, now=now, settle_s=settle_s)
        if verdict is DrainVerdict.WAIT:
            continue
        ended.append(residency)
        calls_cut = residency.in_flight if verdict is DrainVerdict.DEADLINE else 0
        if calls_cut:
            cut.append(residency)
        planned.extend(
            (
                act.MarkResidency(
                    residency_id=residency.residency_id, state=ResidencyState.UNLOADING
                ),
                act.QueueUnload(residency_id=residency.residency_id, node_id=residency.node_id),
                act.Settle(deployment_id=residency.deployment_id),
                act.Audit(
                    actor="reconciler",
                    action="residency.drained",
                    subject_kind="residency",
                    subject_id=residency.residency_id,
                    detail=(
                        ("deployment_id", residency.deployment_id),
                        ("verdict", verdict.value),
                        ("calls_cut", str(calls_cut)),
                    ),
                ),
            )
        )
    return DrainPlan(actions=tuple(planned), ended=tuple(ended), cut=tuple(cut))
