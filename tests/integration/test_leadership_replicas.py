"""Two real control planes (app.py's server, port 0, each with its own scheduler) on one
PostgreSQL database: only the leader places. A deployment created through the follower is not
decided there; the leader's reconciler places it, one residency and one LOAD. When the leader's
session ends, the follower leads with the next epoch and the old leader stops deciding.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import pytest

from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.app import ControlPlane, ControlPlaneSettings, start_control_plane
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.platform.state_machines import JobType
from gantry.scheduler.server import start_scheduler
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import control_plane_pb2_grpc
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import SILENT_WORKER, ScriptedWorker

pytestmark = pytest.mark.postgres


@contextlib.asynccontextmanager
async def second_replica(
    first: Harness, database_url: str
) -> AsyncIterator[tuple[ControlPlane, grpc.aio.Channel]]:
    """Another control plane on the first one's database, with a scheduler of its own (a
    scheduler serves one control plane); the operator token is the database's, so the first
    harness's token works on it."""
    scheduler, _ = await start_scheduler(listen="127.0.0.1:0", service_token=first.scheduler_token)
    control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen="127.0.0.1:0",
            database_url=database_url,
            scheduler_address=f"127.0.0.1:{scheduler.port}",
            scheduler_token=first.scheduler_token,
            reconciler=SILENT_WORKER,
        )
    )
    channel = insecure_channel(f"127.0.0.1:{control_plane.port}")
    try:
        yield control_plane, channel
    finally:
        await channel.close()
        await control_plane.stop()
        await scheduler.stop(grace=0.5)


async def _terminate_leader_session(database_url: str) -> None:
    admin = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        terminated = await admin.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert terminated
    finally:
        await admin.close()


async def _take_over(
    leader: ControlPlane,
    follower: ControlPlane,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The leader's session ends: the follower leads with the next epoch, and the old leader
    notices at its next ping, says so, and runs no more passes while the new leader runs its."""
    with caplog.at_level(logging.INFO, logger="gantry.controlplane.platform.leadership"):
        await _terminate_leader_session(database_url)
        await wait_for(lambda: follower.leadership.is_leader, timeout=30, what="the takeover")
        await wait_for(lambda: not leader.leadership.is_leader, timeout=30, what="the loss")
    assert follower.leadership.epoch == 2
    assert "lost leadership (epoch 1)" in caplog.text
    assert "leading (epoch 2)" in caplog.text
    # A pass of the old leader's under way when it noticed may still end (its transactions are
    # refused from then on, so it decides nothing more); then no other begins.
    await wait_for(
        lambda: follower.reconciler.passes >= 1, timeout=30, what="the new leader's first pass"
    )
    stopped_at = leader.reconciler.passes
    await wait_for(
        lambda: follower.reconciler.passes >= 4, timeout=30, what="the new leader's passes"
    )
    assert leader.reconciler.passes <= stopped_at + 1


async def _follower_sends_its_workers_jobs(
    new_leader: ControlPlane, worker: ScriptedWorker, residency: cp.Residency
) -> None:
    """A job the new leader commits for a worker whose stream the old leader (now a follower)
    holds is sent by the follower's own loop: the leader cannot reach that worker."""
    async with new_leader.database.transaction() as session:
        job = await jobs.create_job(
            session,
            job_type=JobType.HEALTH,
            deployment_id=residency.deployment_id,
            node_id=residency.node_id,
            residency_id=residency.residency_id,
            now=dt.datetime.now(dt.UTC),
        )
    await wait_for(
        lambda: job.job_id in [a.job_id for a in worker.assignments],
        timeout=30,
        what="the follower to send the job to its worker",
    )


async def test_only_the_leader_places_and_the_follower_takes_over_with_the_next_epoch(
    postgres_url: str, tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(postgres_url, root, reconciler=SILENT_WORKER) as first:
        leader = first.control_plane
        worker = ScriptedWorker()  # its stream is the leader's
        await worker.start(first.channel, await first.register_node("on-the-leader"))
        try:
            artifact = await first.register_model(tiny_model_dir, "tiny")
            approval = await first.approve(artifact.artifact_set_id, "tiny")
            async with second_replica(first, postgres_url) as (follower, channel):
                assert (leader.leadership.is_leader, leader.leadership.epoch) == (True, 1)
                assert not follower.leadership.is_leader

                # Created through the follower: it writes the deployment and decides nothing
                # (had it asked its own scheduler, which sees no worker stream of its own, the
                # deployment would say NO_ELIGIBLE_NODE).
                created = await control_plane_pb2_grpc.ControlPlaneStub(channel).CreateDeployment(
                    cp.CreateDeploymentRequest(approval_id=approval.approval_id, capability="tiny"),
                    metadata=first.op_md,
                )
                assert created.state == cp.DEPLOYMENT_STATE_PENDING
                assert list(created.residencies) == []
                assert created.last_failure.reason == ""

                # The leader's reconciler places it: one residency, one LOAD, sent once.
                ready = await first.wait_deployment(
                    created.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=30
                )
                assert [r.node_id for r in ready.residencies] == [worker.welcome.node_id]  # type: ignore[union-attr]
                jobs = await first.operator.ListServingJobs(
                    cp.ListServingJobsRequest(deployment_id=created.deployment_id),
                    metadata=first.op_md,
                )
                assert [j.job_type for j in jobs.jobs] == [cp.SERVING_JOB_TYPE_LOAD]
                loads = [a for a in worker.assignments if a.WhichOneof("spec") == "load"]
                assert [a.job_id for a in loads] == [jobs.jobs[0].job_id]

                # Only the leader's reconciler has run a pass (the follower's loop only flushes).
                assert leader.reconciler.passes > 0 and follower.reconciler.passes == 0
                await _take_over(leader, follower, postgres_url, caplog)
                assert await leader.lifecycle.placer.place(created.deployment_id) == []
                await _follower_sends_its_workers_jobs(follower, worker, ready.residencies[0])
        finally:
            await worker.stop()
