"""Applies what a worker's inventory means (nodes/inventory_rules) to the residency records."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.placement import queue_load
from gantry.controlplane.deployments.residency_stop import mark_cold, queue_unload
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import inventory_rules as rules
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.models import Residency
from gantry.controlplane.platform.state_machines import JobType, ResidencyState
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

# What an adopted server that stops answering its pings shows (its residency and deployment).
ENDPOINT_UNRESPONSIVE = "RUNTIME_UNRESPONSIVE"

_WIRE_STATE = {
    common_pb2.RESIDENCY_STATE_RESIDENT: ResidencyState.RESIDENT,
    common_pb2.RESIDENCY_STATE_LOADING: ResidencyState.LOADING,
    common_pb2.RESIDENCY_STATE_UNLOADING: ResidencyState.UNLOADING,
    common_pb2.RESIDENCY_STATE_UNCERTAIN: ResidencyState.UNCERTAIN,
}


@dataclass
class Reconciled:
    changed: list[Residency] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    unwanted: list[str] = field(default_factory=list)
    queued_jobs: bool = False
    # Residencies a newer message of the worker changed than this inventory: left as they are.
    stale_for: list[str] = field(default_factory=list)


def reported_facts(resident: wg.ResidentModel) -> rules.ReportedFacts:
    return rules.ReportedFacts(
        deployment_id=resident.deployment_id,
        # Anything else a worker might say is treated as the one state that promises nothing.
        state=_WIRE_STATE.get(resident.state, ResidencyState.UNCERTAIN),
        pid=resident.pid,
        artifact_digest=resident.artifact_digest,
        adapter_digest=resident.adapter_digest,
        environment_fingerprint=resident.environment_fingerprint,
        restart_count=resident.restart_count,
        failure_reason=resident.last_failure.reason,
        failure_message=resident.last_failure.message,
        crash_loop=resident.crash_loop,
        adopted=resident.adopted,
        endpoint_url=resident.endpoint_url,
        unresponsive=_failed_liveness(resident),
    )


def _failed_liveness(resident: wg.ResidentModel) -> str:
    """An adopted server's failed ping, as the worker recorded it. Only an adopted one: a model
    host's supervision acts on its own pings (kills and restarts it), which the inventory shows
    as a restart."""
    if not resident.adopted or resident.health.runtime.status != wg.HEALTH_STATUS_FAILED:
        return ""
    return resident.health.runtime.detail or "the adopted server failed its liveness ping"


async def reconcile_inventory(
    session: AsyncSession,
    *,
    node_id: str,
    generation: int,
    inventory: wg.Inventory,
    now: dt.datetime,
) -> Reconciled:
    reported = {r.deployment_id: reported_facts(r) for r in inventory.residents}
    # Under the stream's generation: a new process's Hello presents none in its inventory.
    stamp = rules.Stamp(generation, inventory.sequence)
    rows = {r.residency_id: r for r in await deployments.residencies_on_node(session, node_id)}
    open_by_residency = await jobs.open_jobs_by_residency_on_node(session, node_id)
    records = []
    for row in rows.values():
        open_jobs = open_by_residency.get(row.residency_id, [])
        endpoint_url = ""
        if row.state != ResidencyState.COLD and (
            (await deployments.get_deployment(session, row.deployment_id)).origin == ORIGIN_ADOPTED
        ):
            endpoint_url = (await endpoints.endpoint_of_deployment(session, row.deployment_id)).url
        records.append(
            rules.RecordFacts(
                residency_id=row.residency_id,
                deployment_id=row.deployment_id,
                state=ResidencyState(row.state),
                generation=row.generation,
                artifact_digest=row.artifact_digest,
                adapter_digest=row.adapter_digest,
                environment_fingerprint=row.environment_fingerprint,
                load_in_flight=any(j.job_type == JobType.LOAD for j in open_jobs),
                unload_in_flight=any(j.job_type == JobType.UNLOAD for j in open_jobs),
                endpoint_url=endpoint_url,
                applied=rules.stamp_of(row),
            )
        )
    decisions, unwanted = rules.decide(records, reported, generation=generation, stamp=stamp)
    outcome = Reconciled(unwanted=unwanted)
    touched: set[str] = set()
    for decision in decisions:
        row = rows[decision.residency_id]
        held = reported.get(row.deployment_id)
        if decision.action is rules.Action.KEEP:
            if decision.why == rules.STALE_INVENTORY:
                outcome.stale_for.append(row.residency_id)
            continue
        if decision.action is rules.Action.ADOPT:
            outcome.adopted.append(row.deployment_id)
            if held is not None and (row.pid != held.pid):
                row.pid = held.pid
                rules.mark_applied(row, stamp)
            continue
        await _apply(session, row, decision, held, generation=generation, now=now, out=outcome)
        rules.mark_applied(row, stamp)
        outcome.changed.append(row)
        touched.add(row.deployment_id)
    for deployment_id in touched:
        await settle_deployment(session, deployment_id, now=now)
    return outcome


async def _apply(
    session: AsyncSession,
    row: Residency,
    decision: rules.Decision,
    held: rules.ReportedFacts | None,
    *,
    generation: int,
    now: dt.datetime,
    out: Reconciled,
) -> None:
    action = decision.action
    if action is rules.Action.RESIDENT and held is not None:
        await _mark_resident(session, row, held, generation=generation, now=now)
    elif action is rules.Action.RESTARTING and held is not None:
        await _mark_restarting(session, row, held, now=now)
    elif action is rules.Action.UNRESPONSIVE:
        await _mark_unresponsive(session, row, why=decision.why, now=now)
    elif action is rules.Action.UNCERTAIN:
        await _mark_uncertain(session, row, why=decision.why, now=now)
        out.queued_jobs = True
    elif action is rules.Action.GONE:
        if await _mark_gone(session, row, why=decision.why, now=now):
            out.queued_jobs = True
    elif action is rules.Action.UNLOADED:
        await _cancel_open_jobs(session, row, now=now)
        await deployments.set_residency_state(session, row, ResidencyState.COLD, now=now, pid=0)


async def _mark_resident(
    session: AsyncSession,
    row: Residency,
    held: rules.ReportedFacts,
    *,
    generation: int,
    now: dt.datetime,
) -> None:
    await deployments.set_residency_state(
        session,
        row,
        ResidencyState.RESIDENT,
        now=now,
        pid=held.pid,
        generation=generation,
        restart_count=held.restart_count,
        last_failure_reason="",
        last_failure_message="",
    )


def restart_reason(held: rules.ReportedFacts) -> str:
    """What a restarting residency shows: the crash loop, else the worker's reason."""
    return rules.CRASH_LOOP if held.crash_loop else (held.failure_reason or "RUNTIME_CRASHED")


async def _mark_restarting(
    session: AsyncSession, row: Residency, held: rules.ReportedFacts, *, now: dt.datetime
) -> None:
    was_looping = row.last_failure_reason == rules.CRASH_LOOP
    await deployments.set_residency_state(
        session,
        row,
        ResidencyState.LOADING,
        now=now,
        pid=0,
        restart_count=held.restart_count,  # the worker counts; each report repeats it
        last_failure_reason=restart_reason(held),
        last_failure_message=held.failure_message,
    )
    if held.crash_loop and not was_looping:
        await audit.record_event(
            session,
            actor=f"node:{row.node_id}",
            action="residency.crash_loop",
            subject_kind="residency",
            subject_id=row.residency_id,
            now=now,
            deployment_id=row.deployment_id,
            restart_count=str(held.restart_count),
            message=held.failure_message,
        )


async def _mark_unresponsive(
    session: AsyncSession, row: Residency, *, why: str, now: dt.datetime
) -> None:
    # Not routed to (the scheduler routes RESIDENT residencies only) and shown, until a
    # report says it answers again (Action.RESIDENT). The worker keeps it and keeps pinging;
    # nothing is sent to the server, which is not ours to restart.
    await deployments.set_residency_state(
        session,
        row,
        ResidencyState.LOADING,
        now=now,
        last_failure_reason=ENDPOINT_UNRESPONSIVE,
        last_failure_message=why,
    )
    await audit.record_event(
        session,
        actor=f"node:{row.node_id}",
        action="endpoint.unresponsive",
        subject_kind="residency",
        subject_id=row.residency_id,
        now=now,
        deployment_id=row.deployment_id,
        message=why,
    )


async def _mark_uncertain(
    session: AsyncSession, row: Residency, *, why: str, now: dt.datetime
) -> None:
    """UNCERTAIN (recorded once) and an unload queued."""
    if row.state != ResidencyState.UNCERTAIN:
        await deployments.set_residency_state(
            session,
            row,
            ResidencyState.UNCERTAIN,
            now=now,
            last_failure_reason="RECLAIM_UNVERIFIED",
            last_failure_message=why,
        )
        await audit.record_event(
            session,
            actor="controlplane",
            action="residency.uncertain",
            subject_kind="residency",
            subject_id=row.residency_id,
            now=now,
            why=why,
        )
    await queue_unload(session, row, now=now)


async def _mark_gone(session: AsyncSession, row: Residency, *, why: str, now: dt.datetime) -> bool:
    """COLD, its jobs cancelled; True when a load was queued to bring it back."""
    await _cancel_open_jobs(session, row, now=now)
    await mark_cold(session, row, reason="RUNTIME_CRASHED", message=why, now=now)
    deployment = await deployments.get_deployment(session, row.deployment_id)
    if deployment.state not in LIVE_STATES:
        return False
    # Load it again where it was: the node is here and reporting.
    await queue_load(session, deployment, row, now=now)
    return True


async def _cancel_open_jobs(session: AsyncSession, row: Residency, *, now: dt.datetime) -> None:
    for job in await jobs.open_jobs_for_residency(session, row.residency_id):
        await jobs.cancel_job(session, job, now=now)
