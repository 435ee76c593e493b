"""Drain before unload, end to end: a real in-process control plane and scheduler, scripted
workers that hold each invocation until the test answers it, real client calls over gRPC.

A call in flight on a draining residency finishes; no new call reaches it; its UNLOAD follows
once it is idle, or at its deadline, when the call still running is cut with a typed reason.
Time is a ManualClock and the test runs the reconciler's passes itself. Both stores run it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.common.status import error_info_of
from gantry.controlplane.deployments.drain_rules import DRAIN_SETTLE_S, MAX_DRAIN_DEADLINE_S
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.observability import audit as audit_rows
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
DRAINING = common_pb2.RESIDENCY_STATE_DRAINING
UNLOADING = common_pb2.RESIDENCY_STATE_UNLOADING
COLD = common_pb2.RESIDENCY_STATE_COLD
CALL_TIMEOUT_S = 60.0


@dataclass
class World:
    harness: Harness
    clock: ManualClock
    workers: list[ScriptedWorker]

    async def worker(self, name: str) -> ScriptedWorker:
        worker = ScriptedWorker()
        await worker.start(self.harness.channel, await self.harness.register_node(name))
        self.workers.append(worker)
        return worker

    def on_node(self, node_id: str) -> ScriptedWorker:
        [worker] = [w for w in self.workers if w.welcome and w.welcome.node_id == node_id]
        return worker

    async def deploy(self, tiny_model_dir: Path, *, replicas: int) -> cp.Deployment:
        """`replicas` replicas of the tiny model, one per node, every one RESIDENT."""
        harness = self.harness
        artifact = await harness.register_model(tiny_model_dir, "drained")
        approval = await harness.approve(artifact.artifact_set_id, "drained")
        created = await harness.operator.CreateDeployment(
            cp.CreateDeploymentRequest(
                approval_id=approval.approval_id,
                capability="drained",
                replicas=replicas,
                placement_policy=common_pb2.PLACEMENT_POLICY_SPREAD,
            ),
            metadata=harness.op_md,
        )
        return await self.until(
            created.deployment_id, lambda d: _states(d) == [RESIDENT] * replicas, reconcile=False
        )

    async def until(
        self,
        deployment_id: str,
        settled: Callable[[cp.Deployment], bool],
        *,
        reconcile: bool = True,
    ) -> cp.Deployment:
        """Reconciler passes (no time passing) until the deployment satisfies `settled`."""
        latest: list[cp.Deployment] = []

        async def reached() -> bool:
            if reconcile:
                await self.harness.control_plane.reconciler.reconcile_once()
            latest[:] = [await self.harness.deployment(deployment_id)]
            return settled(latest[0])

        await wait_for(reached, timeout=15, what="the deployment to settle", last=latest)
        return latest[0]

    def call(self, text: str) -> asyncio.Task[inf.EmbedResponse]:
        """A client's Embed of the capability, under way (the worker holds it until answered)."""
        return asyncio.ensure_future(
            self.harness.inference.Embed(
                inf.EmbedRequest(capability="drained", inputs=[text]),
                metadata=self.harness.client_md,
                timeout=CALL_TIMEOUT_S,
            )
        )


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    root = tmp_path / "artifacts"
    root.mkdir()
    clock = ManualClock()
    # Scripted workers heartbeat only when told: nodes stay connected however far the clock goes.
    settings = ReconcilerSettings(heartbeat_interval_s=600.0)
    async with running_gantry(
        database_url, root, clock=clock, reconciler=settings, run_reconciler=False
    ) as harness:
        world = World(harness=harness, clock=clock, workers=[])
        try:
            yield world
        finally:
            for worker in world.workers:
                await worker.stop()


def _states(deployment: cp.Deployment) -> list[int]:
    return sorted(r.state for r in deployment.residencies)


def _residency(deployment: cp.Deployment, state: int) -> common_pb2.Residency:
    [residency] = [r for r in deployment.residencies if r.state == state]
    return residency


async def _next_invoke(worker: ScriptedWorker) -> wg.Invoke:
    return await asyncio.wait_for(worker.invokes.get(), timeout=10)


async def _drain_audits(harness: Harness) -> list[dict[str, object]]:
    async with harness.control_plane.database.transaction() as session:
        events = await audit_rows.list_events(session)
    return [dict(e.detail) for e in events if e.action == "residency.drained"]


async def test_a_scale_down_drains_the_surplus_replica_before_it_unloads(
    world: World, tiny_model_dir: Path
):
    await world.worker("left")
    await world.worker("right")
    deployment = await world.deploy(tiny_model_dir, replicas=2)
    deployment_id = deployment.deployment_id
    # One call on each replica (the scheduler picks the least busy one), held by its worker.
    calls = [world.call("first"), world.call("second")]
    held = {w.welcome.node_id: await _next_invoke(w) for w in world.workers}  # type: ignore[union-attr]

    scaled = await world.harness.operator.ScaleDeployment(
        cp.ScaleDeploymentRequest(deployment_id=deployment_id, replicas=1),
        metadata=world.harness.op_md,
    )
    assert _states(scaled) == [RESIDENT, DRAINING]
    drained = _residency(scaled, DRAINING)
    kept = _residency(scaled, RESIDENT)
    drained_worker, kept_worker = world.on_node(drained.node_id), world.on_node(kept.node_id)

    # No new call reaches the draining replica: the next one goes to the kept one.
    third = world.call("third")
    kept_worker.answer_embed(held[kept.node_id])
    kept_worker.answer_embed(await _next_invoke(kept_worker))

    # Past the settle, the drained replica still runs its call: it keeps draining.
    world.clock.advance(DRAIN_SETTLE_S)
    still = await world.until(deployment_id, lambda d: True)
    assert _states(still) == [RESIDENT, DRAINING]
    assert drained_worker.invokes.empty()
    assert not [a for a in drained_worker.assignments if a.WhichOneof("spec") == "unload"]

    # Its call finishes, answered; then it unloads (UNLOAD job) and ends COLD.
    drained_worker.answer_embed(held[drained.node_id])
    answered = [await call for call in calls]
    assert sorted(a.node_id for a in answered) == sorted((drained.node_id, kept.node_id))
    assert (await third).node_id == kept.node_id
    ended = await world.until(deployment_id, lambda d: _states(d) == [COLD, RESIDENT])
    assert ended.state == cp.DEPLOYMENT_STATE_READY
    assert _residency(ended, RESIDENT).residency_id == kept.residency_id
    unloads = [a for a in drained_worker.assignments if a.WhichOneof("spec") == "unload"]
    assert len(unloads) == 1
    assert drained_worker.cancels.empty()
    assert await _drain_audits(world.harness) == [
        {"deployment_id": deployment_id, "verdict": "IDLE", "calls_cut": "0"}
    ]


async def test_a_drained_deployment_finishes_its_call_then_unloads(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("only")
    deployment = await world.deploy(tiny_model_dir, replicas=1)
    deployment_id = deployment.deployment_id
    in_flight = world.call("in flight")
    invoke = await _next_invoke(worker)

    drained = await world.harness.operator.DrainDeployment(
        cp.DrainDeploymentRequest(deployment_id=deployment_id, deadline_seconds=30),
        metadata=world.harness.op_md,
    )
    assert drained.state == cp.DEPLOYMENT_STATE_UNLOADING
    assert _states(drained) == [DRAINING]
    # Idempotent: draining it again answers the same.
    again = await world.harness.operator.DrainDeployment(
        cp.DrainDeploymentRequest(deployment_id=deployment_id), metadata=world.harness.op_md
    )
    assert (again.state, _states(again)) == (cp.DEPLOYMENT_STATE_UNLOADING, [DRAINING])

    # A new call is refused at once: the deployment will not serve again by itself.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await world.call("too late")
    info = error_info_of(refused.value)
    assert info is not None and info.reason == "DEPLOYMENT_NOT_SERVING"

    world.clock.advance(DRAIN_SETTLE_S)
    waiting = await world.until(deployment_id, lambda d: True)
    assert _states(waiting) == [DRAINING]

    worker.answer_embed(invoke)
    assert len((await in_flight).vectors) == 1
    unloaded = await world.until(deployment_id, lambda d: d.state == cp.DEPLOYMENT_STATE_UNLOADED)
    assert _states(unloaded) == [COLD]
    assert worker.invokes.empty()  # the refused call never reached the worker
    assert await _drain_audits(world.harness) == [
        {"deployment_id": deployment_id, "verdict": "IDLE", "calls_cut": "0"}
    ]


async def test_a_call_still_running_at_the_deadline_is_cut_typed_and_the_unload_goes(
    world: World, tiny_model_dir: Path
):
    worker = await world.worker("only")
    deployment = await world.deploy(tiny_model_dir, replicas=1)
    deployment_id = deployment.deployment_id
    stuck = world.call("never answered")
    invoke = await _next_invoke(worker)

    await world.harness.operator.DrainDeployment(
        cp.DrainDeploymentRequest(deployment_id=deployment_id, deadline_seconds=5),
        metadata=world.harness.op_md,
    )
    world.clock.advance(4)
    waiting = await world.until(deployment_id, lambda d: True)
    assert _states(waiting) == [DRAINING]

    world.clock.advance(1)
    await world.until(deployment_id, lambda d: _states(d) != [DRAINING])
    with pytest.raises(grpc.aio.AioRpcError) as cut:
        await stuck
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info_of(cut.value)
    assert info is not None and info.reason == "DRAIN_DEADLINE_EXCEEDED"
    # The worker is told to drop the call, and only then to unload.
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancel.request_id == invoke.request_id
    unloaded = await world.until(deployment_id, lambda d: d.state == cp.DEPLOYMENT_STATE_UNLOADED)
    assert _states(unloaded) == [COLD]
    assert await _drain_audits(world.harness) == [
        {"deployment_id": deployment_id, "verdict": "DEADLINE", "calls_cut": "1"}
    ]


async def test_drain_refuses_an_unknown_deployment_and_a_deadline_past_its_bound(
    world: World, tiny_model_dir: Path
):
    await world.worker("only")
    deployment = await world.deploy(tiny_model_dir, replicas=1)
    operator, metadata = world.harness.operator, world.harness.op_md
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await operator.DrainDeployment(
            cp.DrainDeploymentRequest(deployment_id="0" * 32), metadata=metadata
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as too_long:
        await operator.DrainDeployment(
            cp.DrainDeploymentRequest(
                deployment_id=deployment.deployment_id,
                deadline_seconds=MAX_DRAIN_DEADLINE_S + 1,
            ),
            metadata=metadata,
        )
    assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(too_long.value)
    assert info is not None and info.metadata["field"] == "deadline_seconds"
    # Nothing was drained by the refused call.
    after = await world.harness.deployment(deployment.deployment_id)
    assert (after.state, _states(after)) == (cp.DEPLOYMENT_STATE_READY, [RESIDENT])


async def test_a_node_drain_finishes_the_call_in_flight_while_its_replica_moves(
    world: World, tiny_model_dir: Path
):
    left = await world.worker("left")
    deployment = await world.deploy(tiny_model_dir, replicas=1)
    deployment_id = deployment.deployment_id
    right = await world.worker("right")
    left_id, right_id = left.welcome.node_id, right.welcome.node_id  # type: ignore[union-attr]
    in_flight = world.call("in flight")
    invoke = await _next_invoke(left)

    await world.harness.operator.DisableNode(
        cp.DisableNodeRequest(node_id=left_id, reason="maintenance"), metadata=world.harness.op_md
    )
    # The replica is placed on the other node at once, while the drained one finishes its call.
    moved = await world.until(deployment_id, lambda d: _states(d) == [RESIDENT, DRAINING])
    assert _residency(moved, DRAINING).node_id == left_id
    assert _residency(moved, RESIDENT).node_id == right_id
    second = world.call("second")
    right.answer_embed(await _next_invoke(right))
    assert (await second).node_id == right_id

    world.clock.advance(DRAIN_SETTLE_S)
    still = await world.until(deployment_id, lambda d: True)
    assert _states(still) == [RESIDENT, DRAINING]
    left.answer_embed(invoke)
    assert (await in_flight).node_id == left_id
    ended = await world.until(deployment_id, lambda d: _states(d) == [COLD, RESIDENT])
    assert _residency(ended, COLD).node_id == left_id
    assert left.invokes.empty() and left.cancels.empty()


async def test_an_unload_cuts_a_drain_short(world: World, tiny_model_dir: Path):
    worker = await world.worker("only")
    deployment = await world.deploy(tiny_model_dir, replicas=1)
    deployment_id = deployment.deployment_id
    held = world.call("held")  # the scripted worker never answers it; a real host's stop would
    await _next_invoke(worker)
    operator, metadata = world.harness.operator, world.harness.op_md
    await operator.DrainDeployment(
        cp.DrainDeploymentRequest(deployment_id=deployment_id, deadline_seconds=600),
        metadata=metadata,
    )
    # The operator stops waiting: the unload stops what still drains now, calls in flight or not.
    cut = await operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=metadata
    )
    assert (cut.state, _states(cut)) == (cp.DEPLOYMENT_STATE_UNLOADING, [UNLOADING])
    unloaded = await world.until(deployment_id, lambda d: d.state == cp.DEPLOYMENT_STATE_UNLOADED)
    assert _states(unloaded) == [COLD]
    assert await _drain_audits(world.harness) == []  # unloaded by the operator, not by the drain
    held.cancel()  # the client goes away
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await held
