"""Scale advice acted on through the normal jobs: a real in-process control plane and scheduler,
scripted workers, and advice handed to the listener the scheduler link calls.

Time is a ManualClock and the test runs the reconciler's passes itself. Both stores run it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.deployments.drain_rules import DRAIN_SETTLE_S
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.observability import audit as audit_rows
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
COLD = common_pb2.RESIDENCY_STATE_COLD
DRAINING = common_pb2.RESIDENCY_STATE_DRAINING


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

    def advise(self, deployment_id: str, desired: int) -> None:
        """What the scheduler link does with a ScaleAdvice output: hand it to its listener."""
        self.harness.control_plane.reconciler.scale_advice.offer(
            scheduler_pb2.ScaleAdvice(
                deployment_id=deployment_id, desired_replicas=desired, reason="scripted advice"
            )
        )

    async def reconcile_until(
        self, deployment_id: str, settled: Callable[[cp.Deployment], bool]
    ) -> cp.Deployment:
        """Reconciler passes (no time passing) until the deployment satisfies `settled`."""
        latest: list[cp.Deployment] = []

        async def reached() -> bool:
            await self.harness.control_plane.reconciler.reconcile_once()
            latest[:] = [await self.harness.deployment(deployment_id)]
            return settled(latest[0])

        await wait_for(reached, timeout=10, what="the deployment to settle", last=latest)
        return latest[0]


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    root = tmp_path / "artifacts"
    root.mkdir()
    clock = ManualClock()
    async with running_gantry(
        database_url, root, clock=clock, reconciler=ReconcilerSettings(), run_reconciler=False
    ) as harness:
        world = World(harness=harness, clock=clock, workers=[])
        try:
            yield world
        finally:
            for worker in world.workers:
                await worker.stop()


def _states(deployment: cp.Deployment) -> list[int]:
    return sorted(r.state for r in deployment.residencies)


async def test_advice_scales_a_deployment_up_then_down_within_its_bounds(
    world: World, tiny_model_dir: Path
):
    await world.worker("left")
    await world.worker("right")
    harness = world.harness
    artifact = await harness.register_model(tiny_model_dir, "scaled")
    approval = await harness.approve(artifact.artifact_set_id, "scaled")
    created = await harness.operator.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id,
            capability="scaled",
            min_replicas=1,
            max_replicas=2,
            placement_policy=common_pb2.PLACEMENT_POLICY_SPREAD,
        ),
        metadata=harness.op_md,
    )
    assert (created.replicas, created.min_replicas, created.max_replicas) == (1, 1, 2)
    assert created.placement_policy == common_pb2.PLACEMENT_POLICY_SPREAD
    deployment_id = created.deployment_id
    ready = await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=10)
    assert (ready.min_replicas, ready.max_replicas) == (1, 2)
    assert ready.placement_policy == common_pb2.PLACEMENT_POLICY_SPREAD
    [first] = ready.residencies

    # Up: advice past the maximum is clamped to it; the second replica goes to the other node.
    world.clock.advance(1)  # the second replica loads after the first
    world.advise(deployment_id, 5)
    scaled_up = await world.reconcile_until(
        deployment_id, lambda d: _states(d) == [RESIDENT, RESIDENT]
    )
    assert scaled_up.replicas == 2
    assert scaled_up.state == cp.DEPLOYMENT_STATE_READY
    assert len({r.node_id for r in scaled_up.residencies}) == 2

    # Down: the most recently loaded replica drains (DRAINING, idle for the settle), then its
    # UNLOAD job takes it to COLD; the first one stays.
    world.advise(deployment_id, 1)
    await world.reconcile_until(deployment_id, lambda d: _states(d) == [RESIDENT, DRAINING])
    world.clock.advance(DRAIN_SETTLE_S)
    scaled_down = await world.reconcile_until(
        deployment_id, lambda d: _states(d) == [COLD, RESIDENT]
    )
    assert scaled_down.replicas == 1
    assert scaled_down.state == cp.DEPLOYMENT_STATE_READY
    [kept] = [r for r in scaled_down.residencies if r.state == RESIDENT]
    assert kept.residency_id == first.residency_id
    jobs = await harness.operator.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=deployment_id), metadata=harness.op_md
    )
    unloads = [j for j in jobs.jobs if j.job_type == cp.SERVING_JOB_TYPE_UNLOAD]
    assert [j.state for j in unloads] == [cp.SERVING_JOB_STATE_SUCCEEDED]

    # Below the minimum: clamped to it, nothing drains.
    world.advise(deployment_id, 0)
    held = await world.reconcile_until(deployment_id, lambda d: True)
    assert (held.replicas, _states(held)) == (1, [COLD, RESIDENT])

    async with harness.control_plane.database.transaction() as session:
        events = await audit_rows.list_events(session)
    autoscaled = [
        (e.detail["from_replicas"], e.detail["to_replicas"], e.detail["reason"])
        for e in events
        if e.action == "deployment.autoscale"
    ]
    assert autoscaled == [(1, 2, "scripted advice"), (2, 1, "scripted advice")]


async def test_advice_for_an_unknown_or_unloaded_deployment_changes_nothing(
    world: World, tiny_model_dir: Path
):
    await world.worker("only")
    harness = world.harness
    artifact = await harness.register_model(tiny_model_dir, "gone")
    approval = await harness.approve(artifact.artifact_set_id, "gone")
    created = await harness.operator.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id, capability="gone", min_replicas=1, max_replicas=3
        ),
        metadata=harness.op_md,
    )
    assert created.placement_policy == common_pb2.PLACEMENT_POLICY_BIN_PACK
    await harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=10)
    await harness.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=created.deployment_id), metadata=harness.op_md
    )
    unloaded = await harness.wait_deployment(
        created.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED, timeout=10
    )
    world.advise(created.deployment_id, 3)
    world.advise("00000000-0000-4000-8000-000000000000", 2)
    after = await world.reconcile_until(created.deployment_id, lambda d: True)
    assert after.replicas == unloaded.replicas == 1
    assert after.state == cp.DEPLOYMENT_STATE_UNLOADED
    assert len(harness.control_plane.reconciler.scale_advice) == 0


async def test_bounds_that_do_not_hold_the_replicas_are_refused_over_grpc(world: World):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await world.harness.operator.CreateDeployment(
            cp.CreateDeploymentRequest(
                approval_id="00000000-0000-4000-8000-000000000000",
                capability="bounded",
                replicas=3,
                max_replicas=2,
            ),
            metadata=world.harness.op_md,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_replicas" in (caught.value.details() or "")
