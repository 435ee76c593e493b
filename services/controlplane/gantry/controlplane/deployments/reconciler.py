"""The reconciler: the one loop that owns every time-driven rule of the control plane.

Each pass, with time from the injected clock:
1. expired leases go back to QUEUED (the old token dies; the next lease counts one more attempt);
2. a CONNECTED node whose last heartbeat is older than the staleness grace is DISCONNECTED and
   its stream closed (a stopped worker no longer holds requests until their deadlines). For a
   stream open on this control plane the last heartbeat is the one in memory (liveness.py),
   whose `last_seen_at` this loop flushes in batches; the database's `last_seen_at` decides only
   for nodes with no stream here (another replica's, or none since a restart);
3. a node absent past the longer absence grace loses its residencies (COLD) and their jobs, and
   its unfinished inspections and probes FAIL (WORKER_UNAVAILABLE);
4. live deployments with fewer placed replicas than wanted are placed (PENDING ones included),
   with backoff per deployment; a refusal leaves them PENDING with the reason;
5. an adopted endpoint's COLD residency gets a new LOAD on its own node once that node is
   connected and the deployment still wanted (endpoints/reload_rules.py), with backoff;
6. UNCERTAIN residencies on a connected node get another UNLOAD, with backoff;
6b. a DRAINING residency whose calls in flight have finished, or whose drain deadline passed
   (its calls still running then cut, DRAIN_DEADLINE_EXCEEDED), goes UNLOADING with its UNLOAD;
7. every connected node with queued jobs gets a pump pass.
8. capabilities' degradation is evaluated (degradation_signals.py); changes are audited.
Before placement, the latest scale advice per deployment (autoscaler.py) is applied: it moves
the replicas wanted within the deployment's bounds, and drains any surplus.
Handlers never sleep or poll: they record facts and `wake()` this loop.
A pass first asks, in one statement, which rules have rows to act on (reconcile_survey.py: steps
1-3 at its start, 4-7 once scale advice is applied); a rule with none opens no transaction. A
quiet pass (no answer yes, no advice, no silent stream in memory) asks both at its start and
reads step 8 and the state gauges in the same transaction: one transaction in all.
Steps 2, 3, 5, 6 and 6b decide: each reads a snapshot in its transaction, asks its pure plan
(reconciler_plans.py), applies the actions with jobs/executor.py and records what changed as
domain events (platform/events.py, published after the commit); stream closes, which are not
the database's, stay here after the commit. Step 1 decides nothing (every expired
lease is requeued), and placement's writes are the placer's (placement.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Unpack

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.common.metrics import metrics_enabled
from gantry.controlplane.deployments import reconcile_survey as survey
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.autoscaler import Autoscaler, ScaleAdviceInbox
from gantry.controlplane.deployments.drain_rules import DrainingResidency
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.lifecycle_parts import LifecycleParts, LifecycleService
from gantry.controlplane.deployments.placement import missing_replicas
from gantry.controlplane.deployments.reconciler_plans import (
    AbsentNode,
    AdoptedResidency,
    ResidencyJobs,
    StaleCandidate,
    UncertainResidency,
    absence_cut,
    awaiting_reload,
    plan_disconnect,
    plan_finish_drains,
    plan_forget_absent,
    plan_reload_adopted,
    plan_retry_uncertain,
)
from gantry.controlplane.endpoints.reload_rules import AdoptedResidencyFacts
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.actions import DisconnectNode, QueueLoad
from gantry.controlplane.jobs.executor import apply_actions
from gantry.controlplane.jobs.handlers import MAX_LOAD_ATTEMPTS, jobs_requeued
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.heartbeat_pacing import DEFAULT_MAX_HEARTBEATS_PER_S, StaleGrace
from gantry.controlplane.nodes.liveness import Heard, Liveness
from gantry.controlplane.observability.state_counts import count_by_state
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.backoff import Backoff
from gantry.controlplane.platform.events import NodeChanged, ResidenciesChanged, record
from gantry.controlplane.platform.models import Deployment, Node, Residency
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    NodeState,
    ResidencyState,
)
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.degradation_signals import evaluate_degradation

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ReconcilerSettings:
    interval_s: float = 1.0
    # Every 3 s, so a silent worker is DISCONNECTED within 10 s of its last heartbeat
    # (PERFORMANCE.md): 3 missed intervals is 9 s, plus at most one reconcile interval.
    heartbeat_interval_s: float = 3.0
    # A node is stale after this many missed heartbeats at the base interval (the issue's
    # default: 3 intervals); a stream told a longer interval gets that interval and the same
    # slack (nodes/heartbeat_pacing.py, `StaleGrace`).
    stale_after_heartbeats: float = 3.0
    # Heartbeats a second one replica takes from the streams it holds before it tells them a
    # longer interval (nodes/heartbeat_pacing.py): 100 keeps 3 s up to 300 streams.
    max_heartbeats_per_s: float = DEFAULT_MAX_HEARTBEATS_PER_S
    # Past this absence its residencies are COLD and their work is re-placed elsewhere.
    absence_grace_s: float = 60.0
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0

    @property
    def grace(self) -> StaleGrace:
        return StaleGrace(
            base_interval_s=self.heartbeat_interval_s,
            stale_after_heartbeats=self.stale_after_heartbeats,
        )

    @property
    def stale_after_s(self) -> float:
        """The staleness grace of a stream told the base interval."""
        return self.grace.seconds(1)


class Reconciler(LifecycleService):
    def __init__(
        self,
        *,
        settings: ReconcilerSettings,
        liveness: Liveness,
        scale_advice: ScaleAdviceInbox | None = None,
        degradation: CapabilityDegradation | None = None,
        **parts: Unpack[LifecycleParts],
    ) -> None:
        super().__init__(**parts)
        clock = self._clock
        # Fed by the inference path; evaluated (and its changes audited) once per pass.
        self.degradation = degradation or CapabilityDegradation(clock)
        self._liveness = liveness
        self.settings = settings
        self._wake = asyncio.Event()
        self._placements = Backoff(
            clock, initial_s=settings.retry_initial_s, max_s=settings.retry_max_s
        )
        self._unloads = Backoff(
            clock, initial_s=settings.retry_initial_s, max_s=settings.retry_max_s
        )
        # Per adopted residency: a server that is down fails each LOAD; ask again less often.
        self._endpoint_loads = Backoff(
            clock, initial_s=settings.retry_initial_s, max_s=settings.retry_max_s
        )
        # Filled from the scheduler link's reader; new advice wakes the loop.
        self.scale_advice = scale_advice or ScaleAdviceInbox()
        self.scale_advice.on_offer = self.wake
        self._autoscaler = Autoscaler(**parts)
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        # Absence is judged only over time this process could hear workers. A control plane down
        # past the grace (killed, upgraded, its database away) would otherwise find every node
        # absent at its first pass, before any worker had redialled, and reload every model of
        # the fleet: a node gets the whole grace from here to come back (as Nomad gives every
        # node a fresh heartbeat timer under a new leader).
        self._hearing_since = clock.now()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="reconciler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        self._wake.set()

    def capacity_freed(self) -> None:
        """A node connected or a residency went COLD: refused placements are due again now."""
        self._placements.reset()
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self._replica_pass()
            except asyncio.CancelledError:
                raise
            except GantryError as error:
                # Typically a race another writer won; the next pass starts from fresh rows.
                log.warning("reconciler pass stopped early: %s", error)
            except Exception:
                # One bad pass must not end the loop: the next one starts from the database.
                log.exception("reconciler pass failed")
            await self._pause()

    async def _replica_pass(self) -> None:
        """A pass on the leader among control-plane replicas (platform/leadership.py), every
        transaction of it fenced by the leader's epoch: one that lost the lead meanwhile rolls
        back NOT_LEADER, and the next pass is skipped. A follower decides nothing; it only does
        what needs its own workers' streams: it flushes when they were last heard (the leader
        reads it to judge them) and sends them their queued jobs (step 7: leasing is a
        compare-and-set, so no job is sent twice)."""
        leadership = self._lifecycle.leadership
        if leadership.is_leader:
            with leadership.fenced():
                await self.reconcile_once()
            return
        await self._flush_last_seen(self._clock.now())
        for node_id in sorted(await self._nodes_with_queued_jobs()):
            await self._lifecycle.dispatch_queued(node_id)

    async def _pause(self) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep(self.settings.interval_s))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, waker):
                task.cancel()
            self._wake.clear()

    async def reconcile_once(self) -> None:
        now = self._clock.now()
        dispatch: set[str] = set()
        silent = self._liveness.stale(now, grace=self.settings.grace)
        # A rule with nothing to act on opens no transaction of its own (reconcile_survey.py).
        # Where no rule before the later questions has anything to do, nothing can change their
        # answers meanwhile, so their answers (asked in the same statement) hold; and where those
        # find nothing either, the pass writes nothing, so its degradation signal and gauges are
        # read here too: a quiet pass is one transaction (issue 29: each costs the event loop
        # about 1.6 ms of CPU) of three statements.
        counts: dict[str, dict[str, int]] | None = None
        async with self._database.transaction() as session:
            first, asked_early = await survey.all_rules(
                session,
                now=now,
                seen_before=self._seen_before(now),
                gone_before=self._gone_before(now),
                absent_before=self._absent_before(now),
            )
            early = None if first.any() or silent or len(self.scale_advice) else asked_early
            quiet = early is not None and not early.any()
            if quiet:
                counts = await self._read_degradation_and_gauges(session, now)
        if first.expired_leases:
            dispatch |= await self._expire_leases(now)
        await self._flush_last_seen(now)
        await self._disconnect_stale(now, silent, rows=first.stale_rows)
        if first.absent:
            await self._forget_absent(now)
        dispatch |= await self._apply_scale_advice()
        later = early
        if later is None:
            async with self._database.transaction() as session:
                later = await survey.later_rules(session)
        dispatch |= await self._place_missing_replicas(any_unplaced=later.unplaced)
        dispatch |= await self._reload_adopted_endpoints(now, any_adopted=later.adopted)
        dispatch |= await self._retry_uncertain(now, any_uncertain=later.uncertain)
        if later.draining:
            dispatch |= await self._finish_drains(now)
        if later.queued_jobs:
            dispatch |= await self._nodes_with_queued_jobs()
        if not quiet:
            async with self._database.transaction() as session:
                counts = await self._read_degradation_and_gauges(session, now)
        if counts is not None:
            metrics.publish_state_counts(counts)
        for node_id in sorted(dispatch):
            if self._hub.get(node_id) is not None:
                await self._lifecycle.dispatch_queued(node_id)
        self.passes += 1

    # ---- 1. leases ----------------------------------------------------------------------------

    async def _expire_leases(self, now: dt.datetime) -> set[str]:
        async with self._database.transaction() as session:
            expired = await jobs.expired_leases(session, now=now)
            for job in expired:
                log.warning(
                    "lease of job %s (%s, attempt %d) expired; queued again",
                    job.job_id,
                    job.job_type,
                    job.attempt_count,
                )
                await jobs.requeue_job(session, job, now=now)
                metrics.lease_expired(job.job_type)
            await jobs_requeued(session, expired, now=now)
            return {job.node_id for job in expired}

    async def _read_degradation_and_gauges(
        self, session: AsyncSession, now: dt.datetime
    ) -> dict[str, dict[str, int]] | None:
        """Step 8, and the state gauges' counts (computed here, once a pass, so a scrape never
        reads the database), in the caller's transaction, after the pass's writes: the counts
        to publish once it commits (None where metrics are off)."""
        await evaluate_degradation(session, self.degradation, now=now)
        return await count_by_state(session) if metrics_enabled() else None

    # ---- 2. and 3. liveness -------------------------------------------------------------------

    async def _flush_last_seen(self, now: dt.datetime) -> None:
        """`last_seen_at` of every node heard since the last flush, in one statement, at most once
        per flush interval (heartbeats themselves never write the database)."""
        if not self._liveness.flush_due(now):
            return
        batch = self._liveness.take_flush(now)
        if batch is None:
            return
        try:
            async with self._database.transaction() as session:
                await nodes.record_last_seen(session, batch)
                generations = await nodes.generations_of(session, batch.node_ids)
        except BaseException:
            self._liveness.flush_failed(batch)  # written with the next flush instead
            raise
        # A stream of a generation the database moved past (another worker process took the
        # node through another replica) is closed: its worker dials again and is told.
        self._hub.close_superseded(generations)

    def _seen_before(self, now: dt.datetime) -> dt.datetime:
        # A row is refreshed as seldom as its stream beats: past 300 streams a replica tells its
        # workers a longer interval (nodes/heartbeat_pacing.py), and the rows of the fleet it and
        # its peers hold age as long between flushes, so the row's grace grows the same. The flush
        # (every base interval) makes a row lag its last beat by at most one base interval more,
        # within the grace's slack: a row beaten every 12 s is at most 15 s old, its grace 18 s.
        return now - dt.timedelta(seconds=self.settings.grace.seconds(self._hub.heartbeat_multiple))

    def _gone_before(self, now: dt.datetime) -> dt.datetime:
        """The absence grace's cut for node stream rows (a replica that died left them)."""
        return now - dt.timedelta(seconds=self.settings.absence_grace_s)

    def _absent_before(self, now: dt.datetime) -> dt.datetime:
        """The absence grace's cut for nodes: none is absent until the grace has passed since
        this process started hearing (`_hearing_since`); a node last seen before that counts as
        seen then."""
        return absence_cut(
            now, grace_s=self.settings.absence_grace_s, hearing_since=self._hearing_since
        )

    async def _disconnect_stale(
        self, now: dt.datetime, stale: Sequence[Heard], *, rows: bool = True
    ) -> None:
        """`stale`: the streams liveness names silent at the pass's start; `rows`: whether the
        database holds stale CONNECTED rows (the pass's survey). Without either, nothing."""
        seen_before = self._seen_before(now)
        silent = {heard.node_id: heard for heard in stale}
        if not silent and not rows:
            return
        disconnected: list[tuple[DisconnectNode, Node]] = []
        silent_here: list[Heard] = []
        async with self._database.transaction() as session:
            for node, heard in await self._stale_rows(session, silent, seen_before=seen_before):
                if heard is not None and await self._held_elsewhere(session, node, seen_before):
                    # Only this replica's stream is silent: it is closed, the node stays
                    # CONNECTED while another replica hears it.
                    silent_here.append(heard)
                    continue
                # Decided one at a time: liveness is read after the writes before it (a
                # heartbeat heard meanwhile still saves its node), and a node named twice finds
                # its row DISCONNECTED the second time.
                planned = plan_disconnect(self._stale_candidate(node, heard))
                applied = await apply_actions(session, planned, now=now)
                record(session, *(NodeChanged(node) for node in applied.nodes))
                disconnected.extend(zip(planned, applied.nodes, strict=True))
        for action, node in disconnected:
            if action.heard is not None:
                # The row now says DISCONNECTED: this stream's liveness is no longer kept here.
                self._liveness.declared_stale(action.heard)
            log.warning(
                "node %s sent no heartbeat since %s: disconnected", node.node_id, node.last_seen_at
            )
            self._close_silent_stream(node.node_id, node.last_seen_at)
        for heard in silent_here:
            if self._liveness.declared_stale(heard):
                log.warning("node %s: this replica's stream went silent; closed", heard.node_id)
                self._close_silent_stream(heard.node_id, heard.heard_at)

    async def _held_elsewhere(
        self, session: AsyncSession, node: Node, seen_before: dt.datetime
    ) -> bool:
        """Whether another replica heard the node's generation since `seen_before`."""
        return await nodes.held_elsewhere(
            session,
            node_id=node.node_id,
            generation=node.generation,
            replica_id=self._hub.replica_id,
            heard_since=seen_before,
        )

    def _close_silent_stream(self, node_id: str, since: dt.datetime | None) -> None:
        """Close the node's stream here, if any: the calls waiting on it fail with the silence
        (since when, not a grace: a stream's grace depends on the interval it was told)."""
        stream = self._hub.get(node_id)
        if stream is not None:
            heard = f"since {since.isoformat(timespec='seconds')}" if since else "at all"
            stream.close(
                GantryError(
                    "WORKER_UNAVAILABLE",
                    f"node {node_id} sent no heartbeat {heard}, past its staleness grace",
                )
            )

    async def _stale_rows(
        self, session: AsyncSession, silent: Mapping[str, Heard], *, seen_before: dt.datetime
    ) -> list[tuple[Node, Heard | None]]:
        """The nodes liveness names silent, then the CONNECTED rows not seen since
        `seen_before`."""
        rows: list[tuple[Node, Heard | None]] = [
            (await nodes.get_node(session, node_id), heard) for node_id, heard in silent.items()
        ]
        for node in await nodes.nodes_in_state(
            session, NodeState.CONNECTED, seen_before=seen_before
        ):
            rows.append((node, None))
        return rows

    def _stale_candidate(self, node: Node, heard: Heard | None) -> StaleCandidate:
        return StaleCandidate(
            node_id=node.node_id,
            state=NodeState(node.state),
            generation=node.generation,
            last_seen_at=node.last_seen_at,
            heard=heard,
            last_heard=self._liveness.last_heard(node.node_id),
            tracked=self._liveness.tracks(node.node_id),
        )

    async def _forget_absent(self, now: dt.datetime) -> None:
        async with self._database.transaction() as session:
            # Rows a replica that died left (its streams' goodbyes never ran).
            await nodes.forget_silent_streams(session, heard_before=self._gone_before(now))
            absent = await self._absent_nodes(session, gone_before=self._absent_before(now))
            applied = await apply_actions(session, plan_forget_absent(absent), now=now)
            if applied.residencies:
                record(session, ResidenciesChanged(tuple(applied.residencies)))

    async def _absent_nodes(
        self, session: AsyncSession, *, gone_before: dt.datetime
    ) -> list[AbsentNode]:
        absent: list[AbsentNode] = []
        for state in (NodeState.DISCONNECTED, NodeState.DISABLED):
            for node in await nodes.nodes_in_state(session, state, seen_before=gone_before):
                stream_open = self._hub.get(node.node_id) is not None
                absent.append(
                    AbsentNode(
                        node_id=node.node_id,
                        last_seen_at=node.last_seen_at,
                        stream_open=stream_open,
                        # Not read for a node whose worker is here: the plan leaves it alone.
                        residencies=()
                        if stream_open
                        else await _residency_jobs(session, node.node_id),
                    )
                )
        return absent

    # ---- 4. scale advice, then placement ------------------------------------------------------

    async def _apply_scale_advice(self) -> set[str]:
        dispatch: set[str] = set()
        for advice in self.scale_advice.take():
            try:
                dispatch |= await self._autoscaler.apply(advice)
            except GantryError as error:
                # Dropped, not retried: the scheduler advises again while the need lasts.
                log.warning("scale advice for %s not applied: %s", advice.deployment_id, error)
        return dispatch

    async def _place_missing_replicas(self, *, any_unplaced: bool = True) -> set[str]:
        if not any_unplaced:  # the pass's survey found every live deployment placed
            self._placements.forget_except(set())
            return set()
        wanted: set[str] = set()
        async with self._database.transaction() as session:
            for deployment in await deployments.deployments_in_states(session, LIVE_STATES):
                if deployment.load_failure_count >= MAX_LOAD_ATTEMPTS:
                    continue
                if await missing_replicas(session, deployment):
                    wanted.add(deployment.deployment_id)
        self._placements.forget_except(wanted)
        dispatch: set[str] = set()
        for deployment_id in sorted(wanted):
            if not self._placements.due(deployment_id):
                continue
            try:
                node_ids = await retry_on_conflict(
                    functools.partial(self._lifecycle.placer.place, deployment_id)
                )
            except GantryError as error:
                # One deployment's trouble must not stop the others; its backoff grows.
                log.warning("placing deployment %s failed: %s", deployment_id, error)
                self._placements.failed(deployment_id)
                continue
            async with self._database.transaction() as session:
                deployment = await deployments.get_deployment(session, deployment_id)
                still_missing = await missing_replicas(session, deployment)
            if still_missing:
                self._placements.failed(deployment_id)
            else:
                self._placements.succeeded(deployment_id)
            dispatch.update(node_ids)
        return dispatch

    # ---- 5. adopted endpoints ------------------------------------------------------------------

    async def _reload_adopted_endpoints(
        self, now: dt.datetime, *, any_adopted: bool = True
    ) -> set[str]:
        """A new LOAD for each adopted endpoint whose residency went COLD while it is wanted, on
        the endpoint's own node (never placed elsewhere: the server runs there). Without a live
        adopted deployment (`any_adopted`, the pass's survey) only the backoffs are forgotten."""
        if not any_adopted:
            self._endpoint_loads.forget_except(set())
            return set()
        async with self._database.transaction() as session:
            adopted = await self._adopted_residencies(session)
            planned = plan_reload_adopted(adopted)
            loads = [action for action in planned if isinstance(action, QueueLoad)]
            for load in loads:
                # Counted as failed until the endpoint is RESIDENT (forget_except below): a
                # server that stays down is asked again with a growing delay. A node that was
                # away made no attempt meanwhile, so its endpoints are due once it connects.
                self._endpoint_loads.failed(load.residency_id)
                log.info(
                    "adopted endpoint of deployment %s is COLD on connected node %s: loading",
                    load.deployment_id,
                    load.node_id,
                )
            applied = await apply_actions(session, planned, now=now)
            if applied.residencies:
                record(session, ResidenciesChanged(tuple(applied.residencies)))
        self._endpoint_loads.forget_except(awaiting_reload(adopted))
        return {load.node_id for load in loads}

    async def _adopted_residencies(self, session: AsyncSession) -> list[AdoptedResidency]:
        adopted: list[AdoptedResidency] = []
        for deployment in await deployments.deployments_in_states(session, LIVE_STATES):
            if deployment.origin != ORIGIN_ADOPTED:
                continue
            for residency in await deployments.residencies_of(session, deployment.deployment_id):
                cold = residency.state == ResidencyState.COLD
                adopted.append(
                    AdoptedResidency(
                        deployment_id=deployment.deployment_id,
                        residency_id=residency.residency_id,
                        node_id=residency.node_id,
                        state=ResidencyState(residency.state),
                        facts=(
                            await self._adopted_facts(session, deployment, residency)
                            if cold
                            else None
                        ),
                        due=self._endpoint_loads.due(residency.residency_id),
                    )
                )
        return adopted

    async def _adopted_facts(
        self, session: AsyncSession, deployment: Deployment, residency: Residency
    ) -> AdoptedResidencyFacts:
        node = await nodes.get_node(session, residency.node_id)
        return AdoptedResidencyFacts(
            deployment_state=DeploymentState(deployment.state),
            deployment_deleted=deployment.deleted_at is not None,
            residency_state=ResidencyState(residency.state),
            node_state=NodeState(node.state),
            node_stream_open=self._hub.get(node.node_id) is not None,
            open_job=bool(await jobs.open_jobs_for_residency(session, residency.residency_id)),
        )

    # ---- 6. uncertain residencies -------------------------------------------------------------

    async def _retry_uncertain(self, now: dt.datetime, *, any_uncertain: bool = True) -> set[str]:
        if not any_uncertain:  # the pass's survey found none: only the backoffs are forgotten
            self._unloads.forget_except(set())
            return set()
        async with self._database.transaction() as session:
            uncertain = await self._uncertain_residencies(session)
            planned = plan_retry_uncertain(uncertain)
            for unload in planned:
                self._unloads.failed(unload.residency_id)
            await apply_actions(session, planned, now=now)
        self._unloads.forget_except({residency.residency_id for residency in uncertain})
        return {unload.node_id for unload in planned}

    async def _uncertain_residencies(self, session: AsyncSession) -> list[UncertainResidency]:
        uncertain: list[UncertainResidency] = []
        for residency in await deployments.all_live_residencies(session):
            if residency.state != ResidencyState.UNCERTAIN:
                continue
            stream_open = self._hub.get(residency.node_id) is not None
            # Its open jobs are read only where they can matter: its worker is here.
            open_job = stream_open and bool(
                await jobs.open_jobs_for_residency(session, residency.residency_id)
            )
            uncertain.append(
                UncertainResidency(
                    residency_id=residency.residency_id,
                    node_id=residency.node_id,
                    stream_open=stream_open,
                    open_job=open_job,
                    due=self._unloads.due(residency.residency_id),
                )
            )
        return uncertain

    # ---- 6b. draining residencies --------------------------------------------------------------

    async def _finish_drains(self, now: dt.datetime) -> set[str]:
        """Drains that are done end in an UNLOAD; past a deadline, the calls still in flight are
        failed (and dropped on the worker) after the commit, before the UNLOAD is dispatched."""
        async with self._database.transaction() as session:
            draining = [
                self._draining(residency)
                for residency in await deployments.all_live_residencies(session)
                if residency.state == ResidencyState.DRAINING
            ]
            plan = plan_finish_drains(draining, now=now)
            # Each deployment locked before its residencies are written, in the order a job
            # result, an unload or a scale locks them (in the other order PostgreSQL deadlocks).
            for deployment_id in sorted({r.deployment_id for r in plan.ended}):
                await deployments.lock_deployment(session, deployment_id)
            applied = await apply_actions(session, plan.actions, now=now)
            if applied.residencies:
                record(session, ResidenciesChanged(tuple(applied.residencies)))
        for residency in plan.cut:
            stream = self._hub.get(residency.node_id)
            if stream is None:
                continue
            cut = stream.cancel_deployment_invokes(
                residency.deployment_id,
                GantryError(
                    "DRAIN_DEADLINE_EXCEEDED",
                    f"residency {residency.residency_id} was drained and its deadline passed "
                    "before this call finished",
                    residency_id=residency.residency_id,
                ),
            )
            log.warning(
                "drain of residency %s reached its deadline: %d call(s) cut",
                residency.residency_id,
                cut,
            )
        return {residency.node_id for residency in plan.ended}

    def _draining(self, residency: Residency) -> DrainingResidency:
        stream = self._hub.get(residency.node_id)
        return DrainingResidency(
            residency_id=residency.residency_id,
            deployment_id=residency.deployment_id,
            node_id=residency.node_id,
            draining_since=residency.updated_at,
            deadline_at=residency.drain_deadline_at,
            in_flight=0 if stream is None else stream.in_flight(residency.deployment_id),
            stream_open=stream is not None,
        )

    # ---- 7. the job pump ----------------------------------------------------------------------

    async def _nodes_with_queued_jobs(self) -> set[str]:
        async with self._database.transaction() as session:
            return {
                job.node_id
                for job in await jobs.open_jobs(session)
                if job.state == "QUEUED" and self._hub.get(job.node_id) is not None
            }


async def _residency_jobs(session: AsyncSession, node_id: str) -> tuple[ResidencyJobs, ...]:
    """The node's residencies, each with its open jobs."""
    open_jobs = await jobs.open_jobs_by_residency_on_node(session, node_id)
    return tuple(
        ResidencyJobs(
            residency_id=residency.residency_id,
            deployment_id=residency.deployment_id,
            state=ResidencyState(residency.state),
            open_job_ids=tuple(job.job_id for job in open_jobs.get(residency.residency_id, [])),
        )
        for residency in await deployments.residencies_on_node(session, node_id)
    )
