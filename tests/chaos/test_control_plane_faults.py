"""The control plane and the scheduler killed and restarted, an unload mid-load, an un-migrated
database: the model host is adopted exactly, nothing is left running, nothing starts half-way."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.chaos.cluster import (
    CHILD_ENV,
    Cluster,
    free_port,
    model_host_pids,
    resident_pid,
    wait_until,
    write_secret,
)

CAPABILITY = "steady"


async def _unload_while_loading(cluster: Cluster, tiny_model_dir: Path) -> None:
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, "abandoned")
    await cluster.wait_deployment(
        deployment_id,
        lambda d: d.state == cp.DEPLOYMENT_STATE_LOADING,
        timeout_s=20,
        what="LOADING",
    )
    # Mid-load for real: its host process exists and has not finished loading.
    await wait_until(
        lambda: bool(model_host_pids(deployment_id)), timeout_s=20, what="a loading host"
    )
    loading = model_host_pids(deployment_id)
    unloading_at = time.monotonic()
    await cluster.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=cluster.op_md, timeout=5
    )
    unloaded = await cluster.wait_deployment(
        deployment_id,
        lambda d: d.state == cp.DEPLOYMENT_STATE_UNLOADED,
        timeout_s=30,
        what="UNLOADED",
    )
    await wait_until(lambda: not model_host_pids(deployment_id), timeout_s=10, what="no host left")
    settled_s = time.monotonic() - unloading_at
    assert all(r.state == common_pb2.RESIDENCY_STATE_COLD for r in unloaded.residencies), unloaded
    print(
        f"\n[8] UnloadDeployment while LOADING (host {loading}) -> UNLOADED, no host left, "
        f"after {settled_s:.2f}s"
    )


async def _sigkill_control_plane(cluster: Cluster, deployment_id: str) -> None:
    assert cluster.control_plane is not None
    host_pid = resident_pid(await cluster.deployment(deployment_id))
    generation = (await cluster.node()).generation
    cluster.control_plane.send(signal.SIGKILL)
    killed_at = time.monotonic()
    await cluster.control_plane.wait_exit(5)
    down = await cluster.embed(CAPABILITY, phase="control plane dead")
    assert not down.ok, down

    cluster.control_plane.start()  # on the same database and port
    up_s = await cluster.wait_serving(cluster.control_plane, cluster.control_plane_port)
    # The client's channel saw connections refused; let it reconnect before judging answers.
    assert cluster.channel is not None
    await asyncio.wait_for(cluster.channel.channel_ready(), timeout=10)
    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="control plane restarted", timeout_s=30, since=killed_at
    )
    ready = await cluster.wait_ready(deployment_id)
    assert resident_pid(ready) == host_pid, "the model host was not adopted exactly: " + "; ".join(
        f"{r.residency_id} pid {r.pid} restarts {r.restart_count} last failure "
        f"{r.last_failure.reason}: {r.last_failure.message}"
        for r in ready.residencies
    )
    assert model_host_pids(deployment_id) == [host_pid]
    node = await cluster.node()
    assert node.generation == generation and node.state == common_pb2.NODE_STATE_CONNECTED
    await cluster.wait_invariants_hold()
    await cluster.assert_current_generation_owns_everything()
    print(
        f"\n[6] control plane SIGKILL + restart: SERVING {up_s:.2f}s after the restart, serving "
        f"again {healed_s:.2f}s after the kill, model host pid {host_pid} unchanged"
    )


async def _sigkill_scheduler(cluster: Cluster, deployment_id: str) -> None:
    assert cluster.scheduler is not None
    host_pid = resident_pid(await cluster.deployment(deployment_id))
    cluster.scheduler.send(signal.SIGKILL)
    killed_at = time.monotonic()
    await cluster.scheduler.wait_exit(5)
    gap = [await cluster.embed(CAPABILITY, phase="scheduler dead") for _ in range(3)]
    for outcome in gap:
        assert not outcome.ok and outcome.reason == "SCHEDULER_UNAVAILABLE", outcome

    cluster.scheduler.start()
    await cluster.wait_serving(cluster.scheduler, cluster.scheduler_port)
    healed_s = await cluster.wait_serving_again(
        CAPABILITY, phase="scheduler restarted", timeout_s=30, since=killed_at
    )
    ready = await cluster.wait_ready(deployment_id)
    assert resident_pid(ready) == host_pid
    await cluster.wait_invariants_hold()
    print(
        f"\n[7] scheduler SIGKILL: calls failed SCHEDULER_UNAVAILABLE in "
        f"{max(o.elapsed_s for o in gap) * 1000:.0f} ms; restarted, serving again "
        f"{healed_s:.2f}s after the kill"
    )


@pytest.mark.timeout(180)
async def test_control_plane_and_scheduler_restarts_adopt_the_running_host(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    await _unload_while_loading(cluster, tiny_model_dir)
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, CAPABILITY)
    await cluster.wait_ready(deployment_id, timeout_s=60)
    assert (await cluster.embed(CAPABILITY, phase="baseline")).ok

    await _sigkill_control_plane(cluster, deployment_id)
    await _sigkill_scheduler(cluster, deployment_id)

    cluster.ledger.assert_truthful(transport_failures_allowed=["control plane dead"])


@pytest.mark.timeout(60)
async def test_control_plane_on_an_unmigrated_database_exits_naming_gantry_migrate(
    postgres_url: str, tmp_path: Path
) -> None:
    token_file = write_secret(tmp_path / "scheduler.token", "svc_scheduler_unused")
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gantry.cli.main", "controlplane",
        "--listen", f"127.0.0.1:{free_port()}",
        "--database-url", postgres_url,
        "--scheduler", f"127.0.0.1:{free_port()}",
        "--scheduler-token-file", str(token_file),
        env={**os.environ, **CHILD_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=45)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    said = output.decode(errors="replace")
    assert process.returncode != 0
    assert "Traceback" not in said, said
    # Log lines may precede it (the service logs to stderr); the verdict is one `error:` line.
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gantry migrate --database-url" in errors[0], said
    print(
        f"\n[9] un-migrated database: exit {process.returncode} after "
        f"{time.monotonic() - started:.2f}s: {errors[0]}"
    )
