"""The control plane's store on SQLite and real PostgreSQL: migrations, hashes, CAS, leases."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import inspect, select, text

from gantry.common import tokens
from gantry.common.errors import GantryError
from gantry.common.manifest import ManifestEntry
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.store import ResultCommit
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform import credentials
from gantry.controlplane.platform.database import Database, head_revision
from gantry.controlplane.platform.models import ApiKey, Node
from gantry.controlplane.platform.state_machines import DeploymentState, JobState, JobType
from tests.waiting import poll

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
SHA = "a" * 64


async def test_alembic_upgrade_from_empty_creates_every_table_and_is_repeatable(database_url: str):
    db = Database.connect(database_url)
    await db.migrate()
    await db.migrate()  # a second `gantry migrate` finds the schema current and changes nothing
    async with db.engine.connect() as connection:
        names = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
        version = (
            await connection.execute(text("SELECT version_num FROM alembic_version"))
        ).scalar()
    await db.close()
    assert {
        "nodes",
        "artifact_sets",
        "artifact_files",
        "deployments",
        "residencies",
        "serving_jobs",
        "api_keys",
        "tenants",
        "operator_tokens",
        "audit_events",
        "installation",
    } <= names
    assert version == head_revision()


async def test_node_credential_and_api_key_are_stored_only_as_hashes(database: Database):
    async with database.transaction() as session:
        node, credential = await nodes.register_node(session, name="n1", labels={}, now=NOW)
        key_row, plain_key = await credentials.create_api_key(
            session, tenant_id="t1", name="k", now=NOW
        )
    async with database.transaction() as session:
        stored_node = await session.scalar(select(Node))
        stored_key = await session.scalar(select(ApiKey))
    assert stored_node is not None and stored_key is not None
    assert credential not in stored_node.credential_hash
    assert stored_node.credential_hash == tokens.hash_token(credential)
    assert plain_key not in stored_key.key_hash
    assert tokens.token_matches(plain_key, stored_key.key_hash)
    assert not tokens.token_matches(plain_key + "x", stored_key.key_hash)


async def test_node_names_are_unique(database: Database):
    async with database.transaction() as session:
        await nodes.register_node(session, name="dup", labels={}, now=NOW)
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            await nodes.register_node(session, name="dup", labels={}, now=NOW)
    assert caught.value.reason == "ALREADY_EXISTS"


async def _deployment_with_job(database: Database):  # type: ignore[no-untyped-def]
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name="n", labels={}, now=NOW)
        artifact = await artifacts.create_artifact_set(
            session,
            name="m",
            location="m",
            manifest=[ManifestEntry(path="config.json", size_bytes=2, sha256=SHA)],
            now=NOW,
        )
        deployment = await deployments.create_deployment(
            session,
            capability="c",
            artifact_set_id=artifact.artifact_set_id,
            adapter={"adapter": "sentence_transformers"},
            environment_id="",
            replicas=1,
            now=NOW,
        )
        residency = await deployments.create_residency(
            session, deployment_id=deployment.deployment_id, node_id=node.node_id, now=NOW
        )
        job = await jobs.create_job(
            session,
            job_type=JobType.LOAD,
            deployment_id=deployment.deployment_id,
            node_id=node.node_id,
            residency_id=residency.residency_id,
            now=NOW,
        )
    return node, deployment, job


async def test_compare_and_set_refuses_a_stale_expected_state(database: Database):
    _, deployment, _ = await _deployment_with_job(database)
    async with database.transaction() as session:
        row = await deployments.get_deployment(session, deployment.deployment_id)
        await deployments.set_deployment_state(session, row, DeploymentState.LOADING, now=NOW)
    # A second writer still believing the row is PENDING loses, and changes nothing.
    stale = deployment
    assert stale.state == DeploymentState.PENDING
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            await deployments.set_deployment_state(session, stale, DeploymentState.LOADING, now=NOW)
    assert caught.value.reason == "INVALID_STATE_TRANSITION"
    async with database.transaction() as session:
        assert (
            await deployments.get_deployment(session, deployment.deployment_id)
        ).state == "LOADING"


async def test_illegal_transition_is_refused_before_touching_the_row(database: Database):
    _, deployment, _ = await _deployment_with_job(database)
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            row = await deployments.get_deployment(session, deployment.deployment_id)
            await deployments.set_deployment_state(session, row, DeploymentState.READY, now=NOW)
    assert caught.value.reason == "INVALID_STATE_TRANSITION"


async def test_job_result_is_idempotent_by_job_id_and_conflicts_are_refused(database: Database):
    node, _, job = await _deployment_with_job(database)
    async with database.transaction() as session:
        row = await jobs.get_job(session, job.job_id)
        token = await jobs.lease_job(session, row, generation=7, lease_seconds=60, now=NOW)
        assert row.attempt_count == 1 and row.state == JobState.LEASED
        assert token not in row.lease_token_hash

    async def send(digest: str, lease_token: str = token, generation: int = 7):  # type: ignore[no-untyped-def]
        async with database.transaction() as session:
            return await jobs.record_result(
                session,
                job_id=job.job_id,
                node_id=node.node_id,
                generation=generation,
                lease_token=lease_token,
                succeeded=True,
                result={"ok": True},
                result_digest=digest,
                failure_reason="",
                failure_message="",
                now=NOW,
            )

    with pytest.raises(GantryError) as bad_token:
        await send("d1", lease_token=tokens.mint_token(tokens.LEASE_TOKEN, job.job_id))
    assert bad_token.value.reason == "LEASE_TOKEN_INVALID"
    with pytest.raises(GantryError) as stale:
        await send("d1", generation=6)
    assert stale.value.reason == "STALE_GENERATION"

    settled, commit = await send("d1")
    assert commit is ResultCommit.COMMITTED and settled.state == JobState.SUCCEEDED
    _, again = await send("d1")
    assert again is ResultCommit.DUPLICATE
    with pytest.raises(GantryError) as conflict:
        await send("d2")
    assert conflict.value.reason == "RESULT_CONFLICT"


async def test_a_dead_generations_jobs_return_to_the_queue_with_their_token_dead(
    database: Database,
):
    node, _, job = await _deployment_with_job(database)
    async with database.transaction() as session:
        row = await jobs.get_job(session, job.job_id)
        old_token = await jobs.lease_job(session, row, generation=1, lease_seconds=60, now=NOW)
    async with database.transaction() as session:
        released = await jobs.release_generation_jobs(
            session, node_id=node.node_id, generation=1, now=NOW
        )
    assert [r.job_id for r in released] == [job.job_id]
    async with database.transaction() as session:
        row = await jobs.get_job(session, job.job_id)
        assert row.state == JobState.QUEUED
        new_token = await jobs.lease_job(session, row, generation=2, lease_seconds=60, now=NOW)
        assert row.attempt_count == 2
    assert new_token != old_token
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            await jobs.record_result(
                session,
                job_id=job.job_id,
                node_id=node.node_id,
                generation=2,
                lease_token=old_token,
                succeeded=True,
                result={},
                result_digest="x",
                failure_reason="",
                failure_message="",
                now=NOW,
            )
    assert caught.value.reason == "LEASE_TOKEN_INVALID"


async def test_timestamps_come_back_timezone_aware(database: Database):
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name="tz", labels={"a": "b"}, now=NOW)
    async with database.transaction() as session:
        stored = await nodes.get_node(session, node.node_id)
    assert stored.created_at == NOW and stored.created_at.tzinfo is not None
    assert stored.labels == {"a": "b"}


async def test_generation_fits_the_database_bigint(database: Database):
    from gantry.common.ids import GENERATION_LIMIT, GENERATION_STEP, next_generation

    generation = next_generation(GENERATION_LIMIT - GENERATION_STEP - 1)  # as large as issued
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name="gen", labels={}, now=NOW)
        await nodes.mark_connected(
            session, node, generation=generation, hostname="h", inventory={}, now=NOW
        )
    async with database.transaction() as session:
        assert (await nodes.get_node(session, node.node_id)).generation == generation


async def test_sqlite_transactions_take_turns_so_none_sees_another_half_done(sqlite_url: str):
    """SQLite allows one writer. Twenty transactions that each read a row, wait, and write back
    what they read plus one: each commits (no "database is locked"), none reads a value another
    is about to change (no lost update), and a transaction opened inside another in the same task
    is refused rather than waiting for itself forever."""
    database = Database.connect(sqlite_url)
    await database.migrate()
    try:
        async with database.transaction() as session:
            node, _ = await nodes.register_node(session, name="contended", labels={}, now=NOW)

        opened = 0

        async def read_then_write() -> None:
            nonlocal opened
            opened += 1
            async with database.transaction() as session:
                row = await session.get(Node, node.node_id)
                assert row is not None
                # Hold the row until all twenty have opened their transactions: the first holder
                # has the other nineteen waiting for its turn to end.
                await poll(lambda: opened == 20, 10.0, "all twenty transactions to open")
                row.generation = row.generation + 1

        await asyncio.gather(*(read_then_write() for _ in range(20)))
        async with database.transaction() as session:
            row = await session.get(Node, node.node_id)
            assert row is not None and row.generation == 20
            with pytest.raises(RuntimeError, match="inside another"):
                async with database.transaction():
                    pass
    finally:
        await database.close()
