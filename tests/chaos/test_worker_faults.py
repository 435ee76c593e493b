"""A worker killed, stopped, or its node disabled: typed errors at once, then serving again."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from pathlib import Path

import grpc
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.chaos.cluster import (
    Cluster,
    model_host_pids,
    pid_alive,
    resident_pid,
    wait_until,
)

CAPABILITY = "fleet"
WORKER_DOWN_REASONS = {"WORKER_UNAVAILABLE", "DEPLOYMENT_NOT_READY"}


async def _first_typed_failure(cluster: Cluster, phase: str, *, timeout_s: float) -> str:
    """Call until a call fails; it must fail typed (a success here would be a stale route)."""
    reasons: list[str] = []

    async def failed() -> bool:
        outcome = await cluster.embed(CAPABILITY, phase=phase)
        if not outcome.ok:
            reasons.append(outcome.reason)
        return not outcome.ok

    await wait_until(failed, timeout_s=timeout_s, what=f"a failure ({phase})", interval_s=0.02)
    return reasons[0]


def _stale_node_logs(cluster: Cluster) -> int:
    """How often the control plane has disconnected this node for its missed heartbeats."""
    assert cluster.control_plane is not None
    log = cluster.control_plane.log_path.read_text(errors="replace")
    return log.count(f"node {cluster.node_id} sent no heartbeat since")


async def _sigkill_worker(cluster: Cluster, deployment_id: str) -> None:
    assert cluster.worker is not None
    old_generation = (await cluster.node()).generation
    host_pid = resident_pid(await cluster.deployment(deployment_id))
    killed_wall = dt.datetime.now(dt.UTC)
    cluster.worker.send(signal.SIGKILL)
    killed_at = time.monotonic()
    reason = await _first_typed_failure(cluster, "worker killed", timeout_s=10)
    typed_s = time.monotonic() - killed_at
    assert reason in WORKER_DOWN_REASONS, reason
    # The model host dies with its parent (PR_SET_PDEATHSIG), not by our hand.
    await wait_until(lambda: not pid_alive(host_pid), timeout_s=5, what="the orphaned host gone")
    host_gone_s = time.monotonic() - killed_at
    await cluster.worker.wait_exit(5)

    cluster.worker.start()  # as the `gantry up` supervisor would
    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="worker restarted", timeout_s=60, since=killed_at
    )
    node = await cluster.node()
    assert node.state == common_pb2.NODE_STATE_CONNECTED
    assert node.generation != old_generation
    ready = await cluster.wait_ready(deployment_id)
    assert resident_pid(ready) != host_pid
    assert model_host_pids(deployment_id) == [resident_pid(ready)]
    await cluster.wait_invariants_hold()
    await cluster.assert_current_generation_owns_everything()
    # Nothing the dead generation did was committed after its death.
    for job in await cluster.jobs(deployment_id):
        if job.updated_at.ToDatetime(dt.UTC) > killed_wall:
            assert job.generation != old_generation or job.state in (
                cp.SERVING_JOB_STATE_FAILED,
                cp.SERVING_JOB_STATE_CANCELLED,
            ), f"the dead generation committed {job}"
    print(
        f"\n[4] worker SIGKILL -> typed {reason} after {typed_s:.2f}s; its host gone after "
        f"{host_gone_s:.2f}s; restarted worker (generation {old_generation} -> "
        f"{node.generation}) serving after {healed_s:.2f}s"
    )


async def _sigstop_worker(cluster: Cluster, deployment_id: str) -> None:
    assert cluster.worker is not None
    generation = (await cluster.node()).generation
    host_pid = resident_pid(await cluster.deployment(deployment_id))
    assert cluster.control_plane is not None
    stale_before = _stale_node_logs(cluster)
    cluster.worker.send(signal.SIGSTOP)
    try:
        # A call that reaches the frozen worker must end when the node is found gone, not hang.
        caught = asyncio.create_task(cluster.embed(CAPABILITY, phase="worker stopped"))
        disconnected_s = await cluster.wait_node_state(
            common_pb2.NODE_STATE_DISCONNECTED, timeout_s=10
        )
        # Found gone by its missed heartbeats (its stream is still open: the frozen process's
        # socket lives on), the control plane's staleness rule, which logs it after its commit.
        control_plane = cluster.control_plane
        await wait_until(
            lambda: _stale_node_logs(cluster) > stale_before,
            timeout_s=10,
            what="the control plane to log the node's missed heartbeats",
            last=control_plane.log_tail,
        )
        in_flight = await caught
        assert not in_flight.ok and in_flight.reason in WORKER_DOWN_REASONS, in_flight
        # Refused while the node is gone, not held for the frozen worker until their deadline
        # (which would end them DEADLINE_EXCEEDED, untyped).
        fast = [await cluster.embed(CAPABILITY, phase="worker stopped") for _ in range(3)]
        for outcome in fast:
            assert not outcome.ok and outcome.reason in WORKER_DOWN_REASONS, outcome
            assert outcome.code == grpc.StatusCode.UNAVAILABLE, outcome
    finally:
        cluster.worker.send(signal.SIGCONT)
    continued_at = time.monotonic()
    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="worker continued", timeout_s=60, since=continued_at
    )
    assert not cluster.worker.exited(), cluster.worker.log_tail()
    node = await cluster.node()
    assert node.state == common_pb2.NODE_STATE_CONNECTED
    ready = await cluster.wait_ready(deployment_id)
    kept = resident_pid(ready) == host_pid
    await cluster.wait_invariants_hold()
    await cluster.assert_current_generation_owns_everything()
    print(
        f"\n[5] worker SIGSTOP -> DISCONNECTED after {disconnected_s:.2f}s; the in-flight call "
        f"failed {in_flight.reason} after {in_flight.elapsed_s:.2f}s; later calls failed in "
        f"{max(o.elapsed_s for o in fast) * 1000:.0f} ms; SIGCONT -> serving after "
        f"{healed_s:.2f}s (generation {generation} -> {node.generation}, host pid "
        f"{'kept' if kept else 'replaced'})"
    )


async def _disable_and_enable(cluster: Cluster, deployment_id: str) -> None:
    host_pid = resident_pid(await cluster.deployment(deployment_id))
    disabled_at = time.monotonic()
    await cluster.operator.DisableNode(
        cp.DisableNodeRequest(node_id=cluster.node_id, reason="chaos drain"),
        metadata=cluster.op_md,
        timeout=5,
    )
    await wait_until(lambda: not pid_alive(host_pid), timeout_s=15, what="the drained host gone")
    drained_s = time.monotonic() - disabled_at
    drained = await cluster.wait_deployment(
        deployment_id,
        lambda d: all(r.state == common_pb2.RESIDENCY_STATE_COLD for r in d.residencies),
        timeout_s=15,
        what="every residency COLD",
    )
    assert model_host_pids(deployment_id) == []
    assert (await cluster.node()).state == common_pb2.NODE_STATE_DISABLED
    refused = await cluster.embed(CAPABILITY, phase="node disabled")
    assert not refused.ok and refused.reason, refused
    await cluster.wait_invariants_hold()

    enabled_at = time.monotonic()
    await cluster.operator.EnableNode(
        cp.EnableNodeRequest(node_id=cluster.node_id), metadata=cluster.op_md, timeout=5
    )
    assert cluster.worker is not None
    restarted = cluster.worker.exited()
    if restarted:  # refused NODE_DISABLED, the worker exits for its supervisor to restart
        cluster.worker.start()
    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="node enabled", timeout_s=60, since=enabled_at
    )
    await cluster.wait_ready(deployment_id)
    await cluster.wait_invariants_hold()
    await cluster.assert_current_generation_owns_everything()
    print(
        f"\n[10] DisableNode -> host gone after {drained_s:.2f}s, residencies "
        f"{[common_pb2.ResidencyState.Name(r.state) for r in drained.residencies]}, calls "
        f"{refused.reason}; EnableNode -> serving after {healed_s:.2f}s"
        f"{' (worker process restarted)' if restarted else ''}"
    )


@pytest.mark.timeout(200)
async def test_killed_stopped_and_disabled_workers_fail_typed_then_serve_again(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, CAPABILITY)
    await cluster.wait_ready(deployment_id, timeout_s=60)
    assert (await cluster.embed(CAPABILITY, phase="baseline")).ok

    await _sigkill_worker(cluster, deployment_id)
    await _sigstop_worker(cluster, deployment_id)
    await _disable_and_enable(cluster, deployment_id)

    cluster.ledger.assert_truthful()
