"""Resource domains from the worker to placement: a worker refuses to start on an invalid
declaration; the domains it declares reach the scheduler's ledger; a deployment whose envelope
fits no node waits PENDING with each node's reason and is placed once a node with room connects.

The scheduler and control plane run in this process (real gRPC); workers are the real agent or
scripted streams. Time for the reconciler is a ManualClock and the test runs its passes itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.common.auth import auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.nodes import store as nodes
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.worker.resource_domains import parse_declaration
from tests.integration.harness import Harness, gantry_on_a_manual_clock, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker, host_ram

MIB = 1 << 20
GIB = 1 << 30
# What the scripted probe measures (rss_peak): the profile's envelope, charged per replica.
ENVELOPE_RAM = 300_000_000
SETTINGS = ReconcilerSettings(heartbeat_interval_s=5.0, retry_initial_s=1.0)


@dataclass
class World:
    harness: Harness
    clock: ManualClock
    workers: list[ScriptedWorker]

    async def worker(self, name: str, *domains: common_pb2.ResourceDomain) -> ScriptedWorker:
        worker = ScriptedWorker(resource_domains=domains)
        await worker.start(self.harness.channel, await self.harness.register_node(name))
        self.workers.append(worker)
        return worker

    async def node_id(self, name: str) -> str:
        listed = await self.harness.operator.ListNodes(
            cp.ListNodesRequest(), metadata=self.harness.op_md
        )
        return {n.name: n.node_id for n in listed.nodes}[name]

    async def reconcile(self) -> None:
        await self.harness.control_plane.reconciler.reconcile_once()


async def scheduler_snapshot(harness: Harness) -> scheduler_pb2.QueueSnapshot:
    """The scheduler's own view: its nodes and its ledger."""
    channel = insecure_channel(f"127.0.0.1:{harness.scheduler_server.port}")
    try:
        return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(),
            metadata=auth_metadata(harness.scheduler_token),
        )
    finally:
        await channel.close()


@pytest.fixture
async def real_time(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """For the real agent, which draws its generation from the real clock."""
    async with running_gantry(database_url, tmp_path) as harness:
        yield harness


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    async with gantry_on_a_manual_clock(database_url, tmp_path, SETTINGS) as (harness, clock):
        world = World(harness=harness, clock=clock, workers=[])
        try:
            yield world
        finally:
            for worker in world.workers:
                await worker.stop()


def test_a_worker_with_an_invalid_resource_domain_exits_2_before_connecting(
    tmp_path: Path,
) -> None:
    credential = tmp_path / "credential"
    credential.write_text("not read: the declaration is refused first\n")
    gantry = Path(sys.executable).with_name("gantry")  # the installed entry point
    finished = subprocess.run(
        [
            str(gantry),
            "worker",
            "--control-plane",
            "127.0.0.1:9",  # nothing listens: a worker that got this far would keep retrying
            "--credential-file",
            str(credential),
            "--artifact-root",
            str(tmp_path),
            "--resource-domain",
            "host.ram=ram:16GiB",
            "--resource-domain",
            "gpu0.vram=vram:8GiB:8GiB",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert finished.returncode == 2
    assert finished.stderr == (
        "gantry worker: error: --resource-domain gpu0.vram=vram:8GiB:8GiB: the margin (8.0 GiB) "
        "must be below the capacity (8.0 GiB)\n"
    )


async def test_a_workers_declared_domains_reach_the_inventory_and_the_scheduler(
    real_time: Harness,
) -> None:
    harness = real_time
    declared = parse_declaration(["host.ram=ram:24GiB:10%", "gpu0.vram=vram:16GiB:1GiB"])
    agent = await harness.start_worker(
        await harness.register_node("declared"), resource_domains=declared
    )
    node_id = agent.node_id
    async with harness.control_plane.database.transaction() as session:
        stored = (await nodes.get_node(session, node_id)).inventory["domains"]
    assert stored == [
        {
            "name": "host.ram",
            "kind": "RAM",
            "capacity_bytes": 24 * GIB,
            "safety_margin_bytes": int(24 * GIB * 0.1),
            "device": 0,
        },
        {
            "name": "gpu0.vram",
            "kind": "VRAM",
            "capacity_bytes": 16 * GIB,
            "safety_margin_bytes": GIB,
            "device": 0,
        },
    ]
    snapshot = await scheduler_snapshot(harness)
    (node,) = [n for n in snapshot.nodes if n.node_id == node_id]
    assert list(node.domains) == [domain.to_proto() for domain in declared]
    assert {"device:cpu", "device:cuda"} <= set(node.labels)
    ledger = {(e.node_id, e.domain.name): e.available_bytes for e in snapshot.ledger}
    assert ledger[(node_id, "gpu0.vram")] == 15 * GIB


async def test_a_deployment_that_fits_no_node_waits_with_each_nodes_reason_until_room_appears(
    world: World, tiny_model_dir: Path
) -> None:
    await world.worker("small", host_ram(256 * MIB))
    await world.worker("tight", host_ram(512 * MIB, margin_bytes=256 * MIB))
    artifact = await world.harness.register_model(tiny_model_dir, "roomy")
    deployment = await world.harness.deploy(artifact.artifact_set_id, "roomy")

    pending = await world.harness.deployment(deployment.deployment_id)
    small, tight = await world.node_id("small"), await world.node_id("tight")
    assert pending.state == cp.DEPLOYMENT_STATE_PENDING
    assert pending.last_failure.reason == "NO_CAPACITY"
    first, second = sorted([(small, "small"), (tight, "tight")])
    message = pending.last_failure.message
    assert message.startswith("none of 2 nodes can take it: ")
    assert f"{first[0]} NO_CAPACITY (" in message and f"{second[0]} NO_CAPACITY (" in message
    assert message.index(first[0]) < message.index(second[0])

    await world.reconcile()  # asked again: still no room anywhere
    still = await world.harness.deployment(deployment.deployment_id)
    assert (still.state, still.last_failure.reason) == (cp.DEPLOYMENT_STATE_PENDING, "NO_CAPACITY")

    await world.worker("roomy", host_ram(4 * GIB))
    roomy = await world.node_id("roomy")
    world.clock.advance(SETTINGS.retry_initial_s)  # the refused deployment's backoff

    async def ready() -> bool:
        await world.reconcile()
        current = await world.harness.deployment(deployment.deployment_id)
        return current.state == cp.DEPLOYMENT_STATE_READY

    await wait_for(ready, timeout=20, what="the deployment placed on the roomy node")
    placed = await world.harness.deployment(deployment.deployment_id)
    assert [r.node_id for r in placed.residencies] == [roomy]
    # The residency charges its envelope in the roomy node's ledger, nowhere else.
    snapshot = await scheduler_snapshot(world.harness)
    reserved = {(e.node_id, e.domain.name): e.reserved_bytes for e in snapshot.ledger}
    assert reserved == {
        (roomy, "host.ram"): ENVELOPE_RAM,
        (small, "host.ram"): 0,
        (tight, "host.ram"): 0,
    }


async def test_a_full_worker_leaves_a_further_deployment_pending_until_one_is_deleted(
    real_time: Harness, tiny_model_dir: Path
) -> None:
    """The worker says its bound in Hello; placement counts its residencies against it, so a
    further deployment is never sent there (no NO_CAPACITY load, no FAILED): it waits PENDING
    with the reason and is placed once a deletion makes room."""
    harness = real_time
    agent = await harness.start_worker(await harness.register_node("bounded"), max_residents=2)
    snapshot = await scheduler_snapshot(harness)
    (node,) = [n for n in snapshot.nodes if n.node_id == agent.node_id]
    assert node.max_residencies == 2
    artifact = await harness.register_model(tiny_model_dir, "bounded")
    approval = await harness.approve(artifact.artifact_set_id, "first")
    first = await harness.create_deployment(approval, "first")
    second = await harness.create_deployment(approval, "second")
    for deployment in (first, second):
        await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)

    third = await harness.create_deployment(approval, "third")
    waiting = await harness.deployment(third.deployment_id)
    assert waiting.state == cp.DEPLOYMENT_STATE_PENDING
    assert waiting.last_failure.reason == "NO_CAPACITY"
    assert (
        f"{agent.node_id} NO_CAPACITY (its worker holds at most 2 model hosts and 2 are resident"
        " or placed)" in waiting.last_failure.message
    )
    assert list(waiting.residencies) == []  # nothing was sent to the full worker

    await harness.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=first.deployment_id), metadata=harness.op_md
    )
    await harness.wait_deployment(first.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    await harness.operator.DeleteDeployment(
        cp.DeleteDeploymentRequest(deployment_id=first.deployment_id), metadata=harness.op_md
    )
    placed = await harness.wait_deployment(third.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert [r.node_id for r in placed.residencies] == [agent.node_id]
    assert (await harness.deployment(second.deployment_id)).state == cp.DEPLOYMENT_STATE_READY
