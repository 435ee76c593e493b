"""The job pump leases only to a stream whose generation the node's row still names: a worker
that reconnected elsewhere (another control-plane replica's Hello claimed the node, simulated
here by that claim written to the database) is sent nothing more on the stream this replica
still holds, and its jobs stay QUEUED for the stream that holds the node. Both stores.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import running_gantry, wait_for
from tests.integration.scripted_worker import SILENT_WORKER, ScriptedWorker


async def test_a_stream_whose_generation_was_claimed_elsewhere_is_leased_nothing(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root, reconciler=SILENT_WORKER) as harness:
        worker = ScriptedWorker()
        await worker.start(harness.channel, await harness.register_node("reconnected-elsewhere"))
        try:
            assert worker.welcome is not None
            node_id, held = worker.welcome.node_id, worker.welcome.accepted_generation
            database = harness.control_plane.database
            # Another replica's Hello for this node: the row names a newer generation now.
            async with database.transaction() as session:
                node, previous = await nodes.claim_generation(
                    session,
                    node_id,
                    presented=0,
                    hostname="scripted",
                    inventory={},
                    now=dt.datetime.now(dt.UTC),
                )
            assert previous == held and node.generation != held

            artifact = await harness.register_model(tiny_model_dir, "elsewhere")
            pending = await harness.operator.AssessCompatibility(
                cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id),
                metadata=harness.op_md,
            )
            # Pumped at once, and again by each reconciler pass (its queued-jobs step).
            passes = harness.control_plane.reconciler.passes
            await wait_for(
                lambda: harness.control_plane.reconciler.passes >= passes + 3,
                timeout=20,
                what="three reconciler passes",
            )
            async with database.transaction() as session:
                [job] = [
                    j
                    for j in await jobs.open_jobs(session)
                    if j.assessment_id == pending.assessment_id
                ]
            assert (job.state, job.attempt_count) == ("QUEUED", 0)
            assert worker.assignments == []
        finally:
            await worker.stop()
