"""A node keeps the rows of every residency it ever had: an inventory from it reads their open
jobs in one query (jobs/store.open_jobs_by_residency_on_node), not one per past residency, and
finds exactly the jobs the per-residency query finds.

Real control plane on port 0, both stores; rows written straight into its database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.common.ids import new_id
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes.inventory import reconcile_inventory
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import Deployment, Residency, ServingJob
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    ResidencyState,
)
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.db_events import STATEMENT, counted
from tests.integration.harness import Harness, gantry_on_a_manual_clock

NOW = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with gantry_on_a_manual_clock(database_url, tmp_path, ReconcilerSettings()) as (
        harness,
        _clock,
    ):
        yield harness


async def _node(harness: Harness, name: str) -> str:
    await harness.register_node(name)
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return {n.name: n for n in listed.nodes}[name].node_id


async def _history(
    database: Database, node_id: str, *, cold: int, open_states: dict[str, JobState]
) -> dict[str, str]:
    """`cold` COLD residencies on the node, each with a finished LOAD, and one LOADING residency
    per entry of `open_states` (name -> the state of its open LOAD); name -> residency id."""
    async with database.transaction() as session:
        deployment = Deployment(
            deployment_id=new_id(),
            capability=f"history-{node_id}",
            adapter={},
            state=DeploymentState.UNLOADED,
            created_at=NOW,
            updated_at=NOW,
        )
        session.add(deployment)
        await session.flush()
        named: dict[str, str] = {}
        rows = [(f"cold-{i}", ResidencyState.COLD, JobState.SUCCEEDED) for i in range(cold)]
        rows += [(name, ResidencyState.LOADING, state) for name, state in open_states.items()]
        for name, residency_state, job_state in rows:
            residency = Residency(
                residency_id=new_id(),
                deployment_id=deployment.deployment_id,
                node_id=node_id,
                state=residency_state,
                updated_at=NOW,
            )
            session.add(residency)
            await session.flush()
            session.add(
                ServingJob(
                    job_id=new_id(),
                    job_type=JobType.LOAD,
                    deployment_id=deployment.deployment_id,
                    node_id=node_id,
                    residency_id=residency.residency_id,
                    state=job_state,
                    created_at=NOW,
                    updated_at=NOW,
                )
            )
            named[name] = residency.residency_id
        return named


async def test_open_jobs_of_a_nodes_residencies_come_in_one_query_as_each_ones_would(
    harness: Harness,
):
    database = harness.control_plane.database
    node_id, other_id = await _node(harness, "long-lived"), await _node(harness, "other")
    named = await _history(
        database,
        node_id,
        cold=3,
        open_states={"queued": JobState.QUEUED, "leased": JobState.LEASED},
    )
    await _history(database, other_id, cold=1, open_states={"elsewhere": JobState.QUEUED})
    async with database.transaction() as session:
        found = await jobs.open_jobs_by_residency_on_node(session, node_id)
        for residency_id in named.values():
            one_by_one = await jobs.open_jobs_for_residency(session, residency_id)
            assert [j.job_id for j in found.get(residency_id, [])] == [j.job_id for j in one_by_one]
    assert set(found) == {named["queued"], named["leased"]}


async def test_an_inventory_reads_as_much_for_a_long_history_as_for_a_short_one(
    harness: Harness,
):
    database = harness.control_plane.database
    short, long = await _node(harness, "short"), await _node(harness, "long")
    await _history(database, short, cold=1, open_states={})
    await _history(database, long, cold=40, open_states={})
    statements = {}
    for node_id in (short, long):
        with counted(database, STATEMENT) as executed:
            async with database.transaction() as session:
                await reconcile_inventory(
                    session, node_id=node_id, generation=1, inventory=wg.Inventory(), now=NOW
                )
        statements[node_id] = executed[0]
    # Before, one query per residency: 41 more for the long history than for the short one.
    assert statements[long] == statements[short], statements
