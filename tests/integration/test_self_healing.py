"""The control plane heals itself: leases, liveness, crashes, adoption, node lifecycle, invariants.

Workers here are scripted streams (real gRPC clients) so each test decides exactly what the
control plane hears; time is a ManualClock and the test runs the reconciler's passes itself.
Both stores run every scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.deployments.drain_rules import DRAIN_SETTLE_S
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.observability import audit as audit_rows
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, restarted_control_plane, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

LEASE_SECONDS = 30.0
SETTINGS = ReconcilerSettings(heartbeat_interval_s=5.0, absence_grace_s=60.0)


@dataclass
class World:
    harness: Harness
    clock: ManualClock
    workers: list[ScriptedWorker]

    async def worker(self, name: str, *, generation: int = 1) -> ScriptedWorker:
        worker = ScriptedWorker(generation=generation)
        await worker.start(self.harness.channel, await self.harness.register_node(name))
        self.workers.append(worker)
        return worker

    async def reconcile(self) -> None:
        await self.harness.control_plane.reconciler.reconcile_once()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.reconcile()

    async def beat(self, worker: ScriptedWorker, name: str) -> None:
        """A heartbeat, waited for until the control plane recorded it at the current time."""
        worker.heartbeat()
        now = self.clock.now()

        async def recorded() -> bool:
            # Heartbeats are kept in memory (liveness.py); `last_seen_at` is flushed in batches.
            heard = self.harness.control_plane.liveness.last_heard((await self.node(name)).node_id)
            return heard is not None and heard.heard_at >= now

        await wait_for(recorded, what=f"the heartbeat of {name} at {now}")

    async def live_for(self, seconds: float, beating: dict[str, ScriptedWorker]) -> None:
        """Let time pass in heartbeat-sized steps, the named workers beating at each step."""
        step = SETTINGS.heartbeat_interval_s
        while seconds > 0:
            for name, worker in beating.items():
                await self.beat(worker, name)
            await self.advance(min(step, seconds))
            seconds -= step

    async def reconcile_until(self, deployment_id: str, state: int) -> cp.Deployment:
        """Run reconciler passes (no time passing) until the deployment reaches `state`."""
        latest: list[cp.Deployment] = []

        async def reached() -> bool:
            await self.reconcile()
            latest[:] = [await self.harness.deployment(deployment_id)]
            return latest[0].state == state

        await wait_for(reached, what=f"deployment state {state}", last=latest)
        return latest[0]

    async def invariants(self) -> cp.InvariantReport:
        return await self.harness.operator.CheckInvariants(
            cp.CheckInvariantsRequest(), metadata=self.harness.op_md
        )

    async def assert_invariants_hold(self) -> None:
        report = await self.invariants()
        broken = {i.name: list(i.offending_ids) for i in report.invariants if not i.holds}
        assert report.all_hold, f"invariants broken: {broken}"

    async def node(self, name: str) -> cp.Node:
        listed = await self.harness.operator.ListNodes(
            cp.ListNodesRequest(), metadata=self.harness.op_md
        )
        return {n.name: n for n in listed.nodes}[name]

    async def jobs(self, deployment_id: str) -> list[cp.ServingJob]:
        listed = await self.harness.operator.ListServingJobs(
            cp.ListServingJobsRequest(deployment_id=deployment_id), metadata=self.harness.op_md
        )
        return list(listed.jobs)


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    root = tmp_path / "artifacts"
    root.mkdir()
    clock = ManualClock()
    async with running_gantry(
        database_url,
        root,
        clock=clock,
        reconciler=SETTINGS,
        lease_seconds=LEASE_SECONDS,
        run_reconciler=False,
    ) as harness:
        world = World(harness=harness, clock=clock, workers=[])
        try:
            yield world
        finally:
            for worker in world.workers:
                await worker.stop()


async def _ready(world: World, tiny_model_dir: Path, capability: str) -> cp.Deployment:
    artifact = await world.harness.register_model(tiny_model_dir, capability)
    deployment = await world.harness.deploy(artifact.artifact_set_id, capability)
    return await world.harness.wait_deployment(
        deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20
    )


async def test_a_lost_assignment_is_redelivered_after_its_lease_expires_with_a_new_token(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("lossy")
    artifact = await world.harness.register_model(tiny_model_dir, "lossy")
    approval = await world.harness.approve(artifact.artifact_set_id, "lossy")
    worker.assignments.clear()  # the pipeline's INSPECT and PROBE jobs
    worker.drop_next_assignments = 1
    deployment = await world.harness.create_deployment(approval, "lossy")
    await wait_for(lambda: len(worker.assignments) == 1, what="the first (lost) assignment")
    lost = worker.assignments[0]
    await world.live_for(LEASE_SECONDS - 1, {"lossy": worker})
    assert len(worker.assignments) == 1, "re-delivered before the lease expired"
    await world.live_for(2, {"lossy": worker})
    await wait_for(lambda: len(worker.assignments) == 2, what="the re-delivered assignment")
    again = worker.assignments[1]
    assert again.job_id == lost.job_id
    assert again.attempt_count == lost.attempt_count + 1
    assert again.lease_token != lost.lease_token
    await world.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    # The dead token is refused, and nothing it says is committed.
    stale = wg.JobResult(job_id=lost.job_id, lease_token=lost.lease_token)
    stale.failure.CopyFrom(common_pb2.Failure(reason="LOAD_FAILED", message="late"))
    worker.send(wg.WorkerMessage(job_result=stale))
    await wait_for(lambda: bool(worker.rejects), what="the stale result refused")
    assert worker.rejects[0].failure.reason == "LEASE_TOKEN_INVALID"
    assert (await world.harness.deployment(deployment.deployment_id)).state == (
        cp.DEPLOYMENT_STATE_READY
    )
    await world.assert_invariants_hold()


async def test_a_silent_node_is_disconnected_then_its_replica_is_placed_elsewhere(
    world: World, tiny_model_dir: Path
):
    first = await world.worker("silent")
    ready = await _ready(world, tiny_model_dir, "moving")
    assert ready.residencies[0].node_id == (await world.node("silent")).node_id
    second = await world.worker("spare")
    # The first stops heartbeating (SIGSTOP-like); the second keeps going.
    await world.live_for(SETTINGS.stale_after_s - 1, {"spare": second})
    assert (await world.node("silent")).state == common_pb2.NODE_STATE_CONNECTED
    await world.live_for(2, {"spare": second})
    assert (await world.node("silent")).state == common_pb2.NODE_STATE_DISCONNECTED
    assert (await world.node("spare")).state == common_pb2.NODE_STATE_CONNECTED
    await asyncio.wait_for(first.ended.wait(), 5)  # its stream was closed, not left hanging
    degraded = await world.harness.deployment(ready.deployment_id)
    assert degraded.state == cp.DEPLOYMENT_STATE_DEGRADED
    # Past the absence grace the replica is lost and re-placed on the spare node.
    await world.live_for(SETTINGS.absence_grace_s + 1, {"spare": second})
    healed = await world.harness.wait_deployment(ready.deployment_id, cp.DEPLOYMENT_STATE_READY)
    spare_id = (await world.node("spare")).node_id
    resident = [r for r in healed.residencies if r.state == common_pb2.RESIDENCY_STATE_RESIDENT]
    assert [r.node_id for r in resident] == [spare_id]
    await world.beat(second, "spare")
    await world.reconcile()
    await world.assert_invariants_hold()


async def test_a_crash_degrades_the_deployment_and_the_restart_heals_it(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("crashy")
    ready = await _ready(world, tiny_model_dir, "crashy")
    resident = worker.residents[ready.deployment_id]
    # The worker restarts the host in place and says so.
    resident.state = common_pb2.RESIDENCY_STATE_LOADING
    resident.pid = 0
    resident.restart_count = 1
    resident.last_failure.CopyFrom(
        common_pb2.Failure(reason="RUNTIME_CRASHED", message="exited with signal SIGKILL")
    )
    worker.report_inventory()
    degraded = await world.harness.wait_deployment(
        ready.deployment_id, cp.DEPLOYMENT_STATE_DEGRADED
    )
    assert degraded.last_failure.reason == "RUNTIME_CRASHED"
    assert degraded.residencies[0].state == common_pb2.RESIDENCY_STATE_LOADING
    # Three crashes in the window: the worker backs off and calls it a crash loop.
    resident.restart_count = 3
    resident.crash_loop = True
    resident.last_failure.reason = "RUNTIME_CRASH_LOOP"
    worker.report_inventory()

    async def crash_loop_recorded() -> bool:
        deployment = await world.harness.deployment(ready.deployment_id)
        return deployment.last_failure.reason == "RUNTIME_CRASH_LOOP"

    await wait_for(crash_loop_recorded, what="RUNTIME_CRASH_LOOP on the deployment")
    async with world.harness.control_plane.database.transaction() as session:
        events = await audit_rows.list_events(session)
    assert any(e.action == "residency.crash_loop" for e in events)
    # Back in service with a new pid.
    resident.state = common_pb2.RESIDENCY_STATE_RESIDENT
    resident.pid = 9999
    resident.crash_loop = False
    resident.ClearField("last_failure")
    worker.report_inventory()
    healed = await world.harness.wait_deployment(ready.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert healed.residencies[0].pid == 9999
    assert healed.residencies[0].restart_count == 3
    await world.assert_invariants_hold()


async def test_a_reconnect_adopts_an_exact_match_and_unloads_anything_else(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("adopter")
    exact = await _ready(world, tiny_model_dir, "exact")
    other = await _ready(world, tiny_model_dir, "other")
    credential_node = await world.node("adopter")
    # The same worker process reconnects (a control-plane restart looks the same to it), but one
    # of its residents now runs other adapter settings than the record says.
    await worker.stop()
    worker.residents[other.deployment_id].adapter_digest = "0" * 64
    again = ScriptedWorker(generation=worker.generation)
    again.residents = worker.residents
    credential = await _rotate_in(world, credential_node.name)
    await again.start(world.harness.channel, credential)
    world.workers.append(again)
    assert again.welcome is not None
    assert list(again.welcome.adopted_deployment_ids) == [exact.deployment_id]
    uncertain = await world.harness.deployment(other.deployment_id)
    assert uncertain.residencies[0].state in (
        common_pb2.RESIDENCY_STATE_UNCERTAIN,
        common_pb2.RESIDENCY_STATE_COLD,
        common_pb2.RESIDENCY_STATE_LOADING,
    )
    # It is unloaded, then loaded again as recorded.
    await wait_for(
        lambda: any(a.WhichOneof("spec") == "unload" for a in again.assignments),
        what="an UNLOAD of the mismatched resident",
    )
    await world.reconcile_until(other.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await world.harness.deployment(exact.deployment_id)).residencies[0].pid == (
        exact.residencies[0].pid
    )
    await world.assert_invariants_hold()


def _back_after(world: World, database_url: str, *, away_s: float) -> Any:
    """The control plane stopped, `away_s` passing while none runs, and a new one started on the
    same port, database, scheduler and clock."""
    return restarted_control_plane(
        world.harness,
        database_url,
        clock=world.clock,
        while_down=lambda: world.clock.advance(away_s),
        reconciler=SETTINGS,
        lease_seconds=LEASE_SECONDS,
        run_reconciler=False,
    )


@contextlib.asynccontextmanager
async def _kept_through_a_long_restart(
    world: World, tiny_model_dir: Path, database_url: str, name: str
) -> AsyncIterator[tuple[ScriptedWorker, cp.Deployment]]:
    """A deployment READY on node `name`, then the control plane away three absence graces (its
    worker's stream ended with it). Yields once the new control plane's passes have run for a
    grace less a second, the residency still RESIDENT: the worker and the deployment as it was."""
    worker = await world.worker(name)
    ready = await _ready(world, tiny_model_dir, name)
    await worker.stop()
    async with _back_after(world, database_url, away_s=3 * SETTINGS.absence_grace_s):
        await world.reconcile()
        await world.advance(SETTINGS.absence_grace_s - 1)
        kept = await world.harness.deployment(ready.deployment_id)
        assert kept.residencies[0].state == common_pb2.RESIDENCY_STATE_RESIDENT, kept
        yield worker, ready


async def test_a_control_plane_away_past_the_absence_grace_adopts_what_kept_running(
    world: World, tiny_model_dir: Path, database_url: str
):
    # A control plane killed or upgraded for longer than the absence grace: the workers could
    # not reach it, so their silence meanwhile says nothing. Each node gets the whole grace from
    # the restart to redial, and its residents are adopted as they run, not reloaded.
    async with _kept_through_a_long_restart(world, tiny_model_dir, database_url, "steady") as (
        worker,
        ready,
    ):
        again = ScriptedWorker(generation=worker.generation)
        again.residents = worker.residents
        await again.start(world.harness.channel, world.harness.credentials["steady"])
        world.workers.append(again)
        assert again.welcome is not None
        assert list(again.welcome.adopted_deployment_ids) == [ready.deployment_id]
        assert list(again.welcome.unload_deployment_ids) == []
        healed = await world.reconcile_until(ready.deployment_id, cp.DEPLOYMENT_STATE_READY)
        assert [(r.residency_id, r.pid) for r in healed.residencies] == [
            (r.residency_id, r.pid) for r in ready.residencies
        ]
        assert not any(a.WhichOneof("spec") == "load" for a in again.assignments)
        await world.assert_invariants_hold()


async def test_a_node_that_does_not_come_back_is_absent_one_grace_after_the_restart(
    world: World, tiny_model_dir: Path, database_url: str
):
    async with _kept_through_a_long_restart(world, tiny_model_dir, database_url, "gone") as (
        _,
        ready,
    ):
        await world.advance(2)
        lost = await world.harness.deployment(ready.deployment_id)
        assert lost.residencies[0].state == common_pb2.RESIDENCY_STATE_COLD, lost
        assert lost.residencies[0].last_failure.reason == "WORKER_UNAVAILABLE", lost


async def _rotate_in(world: World, name: str) -> str:
    """The scripted worker kept no credential: the harness registered it; reuse by lookup."""
    return world.harness.credentials[name]


async def test_a_failed_unload_is_uncertain_and_retried_never_cold(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("sticky")
    ready = await _ready(world, tiny_model_dir, "sticky")

    def unverified(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") != "unload":
            return worker.default_answer(job)
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        result.failure.CopyFrom(
            common_pb2.Failure(reason="RECLAIM_UNVERIFIED", message="pid 4242 did not exit")
        )
        return result

    worker.answer = unverified
    await world.harness.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=ready.deployment_id), metadata=world.harness.op_md
    )

    async def uncertain() -> bool:
        deployment = await world.harness.deployment(ready.deployment_id)
        return deployment.residencies[0].state == common_pb2.RESIDENCY_STATE_UNCERTAIN

    await wait_for(uncertain, what="the residency UNCERTAIN")
    deployment = await world.harness.deployment(ready.deployment_id)
    assert deployment.state == cp.DEPLOYMENT_STATE_UNLOADING
    assert deployment.residencies[0].last_failure.reason == "RECLAIM_UNVERIFIED"
    unloads = sum(a.WhichOneof("spec") == "unload" for a in worker.assignments)
    # The reconciler tries again after its backoff; this time the process is gone.
    worker.answer = worker.default_answer
    await world.advance(SETTINGS.retry_initial_s + 0.1)
    await world.harness.wait_deployment(ready.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    assert sum(a.WhichOneof("spec") == "unload" for a in worker.assignments) == unloads + 1
    await world.assert_invariants_hold()


async def test_a_disabled_node_is_drained_and_its_replica_placed_elsewhere(
    world: World, tiny_model_dir: Path
):
    await world.worker("to-disable")
    ready = await _ready(world, tiny_model_dir, "drained")
    await world.worker("keeper")
    node = await world.node("to-disable")
    disabled = await world.harness.operator.DisableNode(
        cp.DisableNodeRequest(node_id=node.node_id, reason="maintenance"),
        metadata=world.harness.op_md,
    )
    assert disabled.state == common_pb2.NODE_STATE_DISABLED
    assert disabled.disabled_reason == "maintenance"
    # Its replica drains first (no call in flight here: once the settle has passed, it unloads).
    await world.advance(DRAIN_SETTLE_S)
    keeper_id = (await world.node("keeper")).node_id

    async def moved() -> bool:
        deployment = await world.harness.deployment(ready.deployment_id)
        states = {(r.node_id, r.state) for r in deployment.residencies}
        return (keeper_id, common_pb2.RESIDENCY_STATE_RESIDENT) in states and (
            node.node_id,
            common_pb2.RESIDENCY_STATE_COLD,
        ) in states

    await wait_for(moved, what="the replica unloaded from the disabled node and placed on keeper")
    await world.assert_invariants_hold()
    enabled = await world.harness.operator.EnableNode(
        cp.EnableNodeRequest(node_id=node.node_id), metadata=world.harness.op_md
    )
    assert enabled.state == common_pb2.NODE_STATE_CONNECTED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await world.harness.operator.DisableNode(
            cp.DisableNodeRequest(node_id="not-a-uuid"), metadata=world.harness.op_md
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_check_invariants_names_an_orphaned_lease(world: World, tiny_model_dir: Path):
    worker = await world.worker("orphaner")
    artifact = await world.harness.register_model(tiny_model_dir, "orphan")
    approval = await world.harness.approve(artifact.artifact_set_id, "orphan")
    worker.assignments.clear()  # the pipeline's INSPECT and PROBE jobs
    worker.drop_next_assignments = 1
    deployment = await world.harness.create_deployment(approval, "orphan")
    await wait_for(lambda: len(worker.assignments) == 1, what="the lost assignment")
    # Time passes without a reconciler pass: the expired lease is an orphan, by name.
    world.clock.advance(LEASE_SECONDS + 1)
    await world.beat(worker, "orphaner")
    report = await world.invariants()
    orphans = {i.name: list(i.offending_ids) for i in report.invariants}["no_orphan_serving_work"]
    jobs = await world.jobs(deployment.deployment_id)
    assert not report.all_hold
    assert orphans == [f"job:{jobs[0].job_id}"]
    await world.reconcile()
    await world.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    await world.assert_invariants_hold()
