"""Tenant policies over the real in-process control plane: stored and read back on SQLite and
PostgreSQL, checked before anything changes, audited, for operators only, and pushed to the
scheduler after the commit and again on every reconnect; the queue snapshot is the scheduler's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.engine import Connection

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import RunningServer, ServiceBinding, create_server, insecure_channel
from gantry.common.ids import new_id
from gantry.common.status import error_info_of
from gantry.controlplane.app import ControlPlane, ControlPlaneSettings, start_control_plane
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import credentials
from gantry.controlplane.platform.database import Database, alembic_config, migrate_database
from gantry.controlplane.tenants import store as tenants
from gantry.controlplane.tenants.policy_rules import TenantPolicySettings
from gantry.scheduler.auth import ServiceTokenAuthenticator
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import control_plane_pb2_grpc as cp_grpc
from tests.integration.harness import Harness, running_gantry, wait_for

INTERACTIVE = common_pb2.PRIORITY_INTERACTIVE
BATCH = common_pb2.PRIORITY_BATCH
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
DEFAULTS = common_pb2.TenantPolicy(weight=1, budget_window_seconds=60)


def defaults_of(tenant_id: str) -> common_pb2.TenantPolicy:
    policy = common_pb2.TenantPolicy()
    policy.CopyFrom(DEFAULTS)
    policy.tenant_id = tenant_id
    return policy


async def refusal(call) -> tuple[grpc.StatusCode, str, str]:  # type: ignore[no-untyped-def]
    """The status code, reason and `field` of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    return caught.value.code(), info.reason, info.metadata.get("field", "")


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        yield harness


# ---- the RPCs, on both stores ------------------------------------------------------------------


async def test_a_stored_policy_reads_back_normalised_and_lists_beside_default_tenants(
    gantry: Harness,
):
    sent = common_pb2.TenantPolicy(
        tenant_id="gold",
        weight=5,
        max_queue_depth=200,
        max_concurrency=20,
        budget_units=10_000,
        budget_window_seconds=0,  # 0 = 60
        allowed_priorities=[BATCH, INTERACTIVE],
    )
    stored = await gantry.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(policy=sent), metadata=gantry.op_md
    )
    expected = common_pb2.TenantPolicy()
    expected.CopyFrom(sent)
    expected.budget_window_seconds = 60
    expected.allowed_priorities[:] = [INTERACTIVE, BATCH]
    assert stored == expected
    read = await gantry.operator.GetTenantPolicy(
        cp.GetTenantPolicyRequest(tenant_id="gold"), metadata=gantry.op_md
    )
    assert read == expected
    # tenant-a was made by the harness's CreateApiKey: a tenant with no policy of its own.
    assert await gantry.operator.GetTenantPolicy(
        cp.GetTenantPolicyRequest(tenant_id="tenant-a"), metadata=gantry.op_md
    ) == defaults_of("tenant-a")

    first = await gantry.operator.ListTenants(
        cp.ListTenantsRequest(page_size=1), metadata=gantry.op_md
    )
    second = await gantry.operator.ListTenants(
        cp.ListTenantsRequest(page_size=1, page_token=first.next_page_token),
        metadata=gantry.op_md,
    )
    assert list(first.tenants) == [expected]
    assert list(second.tenants) == [defaults_of("tenant-a")]
    assert second.next_page_token == ""


async def test_an_unknown_tenant_is_not_found_until_a_policy_creates_it(gantry: Harness):
    get = cp.GetTenantPolicyRequest(tenant_id="newcomer")
    assert await refusal(gantry.operator.GetTenantPolicy(get, metadata=gantry.op_md)) == (
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
        "",
    )
    await gantry.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(policy=common_pb2.TenantPolicy(tenant_id="newcomer")),
        metadata=gantry.op_md,
    )
    created = await gantry.operator.GetTenantPolicy(get, metadata=gantry.op_md)
    assert created == defaults_of("newcomer")  # every unset field took its default


INVALID_POLICIES = [
    ("policy.tenant_id", common_pb2.TenantPolicy(tenant_id="")),
    ("policy.tenant_id", common_pb2.TenantPolicy(tenant_id="has space")),
    ("policy.weight", common_pb2.TenantPolicy(tenant_id="gold", weight=1001)),
    ("policy.max_queue_depth", common_pb2.TenantPolicy(tenant_id="gold", max_queue_depth=100_001)),
    ("policy.max_concurrency", common_pb2.TenantPolicy(tenant_id="gold", max_concurrency=100_001)),
    ("policy.budget_units", common_pb2.TenantPolicy(tenant_id="gold", budget_units=2**63)),
    (
        "policy.budget_window_seconds",
        common_pb2.TenantPolicy(tenant_id="gold", budget_window_seconds=86_401),
    ),
    (
        "policy.allowed_priorities",
        common_pb2.TenantPolicy(tenant_id="gold", allowed_priorities=[BATCH, BATCH]),
    ),
    (
        "policy.allowed_priorities",
        common_pb2.TenantPolicy(
            tenant_id="gold", allowed_priorities=[common_pb2.PRIORITY_UNSPECIFIED]
        ),
    ),
    # A tenant that does not exist yet is not created by a refused policy either.
    ("policy.weight", common_pb2.TenantPolicy(tenant_id="ghost", weight=5000)),
]


async def test_an_invalid_policy_is_refused_naming_its_field_and_changes_nothing(
    gantry: Harness,
):
    kept = await gantry.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(policy=common_pb2.TenantPolicy(tenant_id="gold", weight=7)),
        metadata=gantry.op_md,
    )
    async with gantry.control_plane.database.transaction() as session:
        events_before = len(await audit.list_events(session))
    for field, policy in INVALID_POLICIES:
        call = gantry.operator.SetTenantPolicy(
            cp.SetTenantPolicyRequest(policy=policy), metadata=gantry.op_md
        )
        assert await refusal(call) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            field,
        ), policy
    assert (
        await gantry.operator.GetTenantPolicy(
            cp.GetTenantPolicyRequest(tenant_id="gold"), metadata=gantry.op_md
        )
        == kept
    )
    listed = await gantry.operator.ListTenants(cp.ListTenantsRequest(), metadata=gantry.op_md)
    assert [t.tenant_id for t in listed.tenants] == ["gold", "tenant-a"]
    async with gantry.control_plane.database.transaction() as session:
        assert len(await audit.list_events(session)) == events_before


async def test_setting_a_policy_is_audited_with_who_and_what(gantry: Harness):
    await gantry.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(
            policy=common_pb2.TenantPolicy(
                tenant_id="gold", weight=3, budget_units=500, allowed_priorities=[BATCH]
            )
        ),
        metadata=gantry.op_md,
    )
    async with gantry.control_plane.database.transaction() as session:
        events = [e for e in await audit.list_events(session) if e.action == "tenant.set_policy"]
    [event] = events
    operator_id = tokens.parse_token(gantry.operator_token, kind=tokens.OPERATOR_TOKEN)
    assert operator_id is not None
    assert (event.actor, event.subject_kind, event.subject_id) == (
        operator_id.token_id,
        "tenant",
        "gold",
    )
    assert event.detail == {
        "weight": "3",
        "max_queue_depth": "0",
        "max_concurrency": "0",
        "budget_units": "500",
        "budget_window_seconds": "60",
        "allowed_priorities": "PRIORITY_BATCH",
    }


async def test_a_client_key_may_neither_read_nor_set_policies_nor_see_the_queue(
    gantry: Harness,
):
    denied = (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", "")
    operator = gantry.operator
    client = gantry.client_md
    policy = common_pb2.TenantPolicy(tenant_id="tenant-a", weight=1000)
    assert (
        await refusal(
            operator.SetTenantPolicy(cp.SetTenantPolicyRequest(policy=policy), metadata=client)
        )
        == denied
    )
    assert (
        await refusal(
            operator.GetTenantPolicy(
                cp.GetTenantPolicyRequest(tenant_id="tenant-a"), metadata=client
            )
        )
        == denied
    )
    assert await refusal(operator.ListTenants(cp.ListTenantsRequest(), metadata=client)) == denied
    assert (
        await refusal(
            operator.GetQueueSnapshot(scheduler_pb2.GetQueueSnapshotRequest(), metadata=client)
        )
        == denied
    )
    assert await operator.GetTenantPolicy(
        cp.GetTenantPolicyRequest(tenant_id="tenant-a"), metadata=gantry.op_md
    ) == defaults_of("tenant-a")


async def test_a_stored_policy_reaches_the_real_scheduler_and_shows_in_its_queue_snapshot(
    gantry: Harness,
):
    stored = await gantry.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(
            policy=common_pb2.TenantPolicy(tenant_id="gold", weight=5, budget_units=1000)
        ),
        metadata=gantry.op_md,
    )
    seen: list[scheduler_pb2.QueueSnapshot] = []

    async def scheduler_knows_gold() -> bool:
        seen[:] = [
            await gantry.operator.GetQueueSnapshot(
                scheduler_pb2.GetQueueSnapshotRequest(), metadata=gantry.op_md
            )
        ]
        return any(t.tenant_id == "gold" for t in seen[0].tenants)

    await wait_for(scheduler_knows_gold, timeout=10, what="gold in the scheduler", last=seen)
    [gold] = [t for t in seen[0].tenants if t.tenant_id == "gold"]
    assert (gold.weight, gold.budget_units) == (stored.weight, stored.budget_units)
    assert seen[0].control_plane_connected


# ---- persistence, on both stores -----------------------------------------------------------------


def gold(**changes: object) -> TenantPolicySettings:
    return TenantPolicySettings(tenant_id="gold", **changes)  # type: ignore[arg-type]


async def test_upserts_replace_the_policy_and_only_stored_ones_go_to_the_scheduler(
    database: Database,
):
    async with database.transaction() as session:
        await credentials.create_api_key(session, tenant_id="plain", name="k", now=NOW)
        await tenants.upsert_tenant_policy(
            session, gold(weight=2, allowed_priorities=(1, 2)), updated_by="op-1", now=NOW
        )
    later = NOW + dt.timedelta(minutes=1)
    async with database.transaction() as session:
        row = await tenants.upsert_tenant_policy(
            session, gold(weight=9, budget_units=2**63 - 1), updated_by="op-2", now=later
        )
        assert (row.updated_by, row.updated_at) == ("op-2", later)
    async with database.transaction() as session:
        assert await tenants.stored_policies(session) == [gold(weight=9, budget_units=2**63 - 1)]
        plain = await tenants.get_tenant(session, "plain")
        assert tenants.policy_of(plain) == TenantPolicySettings(tenant_id="plain")
        assert plain.updated_at is None
        assert [t.tenant_id for t in await tenants.list_tenants(session, after="", limit=1)] == [
            "gold"
        ]
        assert [
            t.tenant_id for t in await tenants.list_tenants(session, after="gold", limit=5)
        ] == ["plain"]


async def test_a_tenant_from_before_policies_existed_reads_as_the_default_policy(
    database_url: str,
):
    def upgrade(connection: Connection, revision: str) -> None:
        command.upgrade(alembic_config(connection), revision)

    database = Database.connect(database_url)
    try:
        async with database.engine.begin() as connection:
            await connection.run_sync(upgrade, "0004")
            await connection.execute(
                text(
                    "INSERT INTO tenants (tenant_id, created_at) VALUES ('old', CURRENT_TIMESTAMP)"
                )
            )
        await database.migrate()
        async with database.transaction() as session:
            old = await tenants.get_tenant(session, "old")
            assert tenants.policy_of(old) == TenantPolicySettings(tenant_id="old")
            assert await tenants.stored_policies(session) == []
    finally:
        await database.close()


# ---- the push to the scheduler and the snapshot, through a recording scheduler -------------------


class RecordingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Records every input of every Connect stream; hangs up on demand; serves a fixed snapshot."""

    def __init__(self, snapshot: scheduler_pb2.QueueSnapshot) -> None:
        self.snapshot = snapshot
        self.inputs: list[scheduler_pb2.SchedulerInput] = []
        self.connects = 0
        self._hang_up = asyncio.Event()

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]
        self.connects += 1
        self._hang_up = hang_up = asyncio.Event()

        async def record() -> None:
            async for message in request_iterator:
                self.inputs.append(message)

        reader = asyncio.ensure_future(record())
        hung_up = asyncio.ensure_future(hang_up.wait())
        await asyncio.wait({reader, hung_up}, return_when=asyncio.FIRST_COMPLETED)
        for task in (reader, hung_up):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def GetQueueSnapshot(self, request, context):  # type: ignore[no-untyped-def]
        return self.snapshot

    def hang_up(self) -> None:
        """End the current stream, as a restarting scheduler would."""
        self._hang_up.set()

    def of_kind(self, kind: str) -> list[scheduler_pb2.SchedulerInput]:
        return [m for m in self.inputs if m.WhichOneof("kind") == kind]


@dataclass
class Recorded:
    scheduler: RecordingScheduler
    scheduler_server: RunningServer
    control_plane: ControlPlane
    operator: cp_grpc.ControlPlaneStub
    op_md: tuple[tuple[str, str], ...]


SNAPSHOT = scheduler_pb2.QueueSnapshot(
    control_plane_connected=True,
    queued=3,
    tenants=[scheduler_pb2.TenantLoad(tenant_id="gold", weight=5, queued=3, weight_share=1.0)],
)


@pytest.fixture
async def recorded(sqlite_url: str) -> AsyncIterator[Recorded]:
    service_token = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
    operator_token = tokens.mint_token(tokens.OPERATOR_TOKEN, new_id())
    scheduler = RecordingScheduler(SNAPSHOT)
    server = await create_server(
        listen="127.0.0.1:0",
        services=[
            ServiceBinding(
                "gantry.v1.Scheduler",
                scheduler,
                scheduler_pb2_grpc.add_SchedulerServicer_to_server,
            )
        ],
        authenticator=ServiceTokenAuthenticator(service_token),
    )
    await migrate_database(sqlite_url)
    control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen="127.0.0.1:0",
            database_url=sqlite_url,
            scheduler_address=f"127.0.0.1:{server.port}",
            scheduler_token=service_token,
            bootstrap_operator_token=operator_token,
            run_reconciler=False,
        )
    )
    await control_plane.scheduler.wait_connected(10)
    channel = insecure_channel(f"127.0.0.1:{control_plane.port}")
    try:
        yield Recorded(
            scheduler=scheduler,
            scheduler_server=server,
            control_plane=control_plane,
            operator=cp_grpc.ControlPlaneStub(channel),
            op_md=auth_metadata(operator_token),
        )
    finally:
        await channel.close()
        await control_plane.stop()
        await server.stop(grace=0.1)


async def test_a_stored_policy_is_pushed_after_its_commit_and_again_on_every_reconnect(
    recorded: Recorded,
):
    scheduler = recorded.scheduler
    await recorded.operator.CreateApiKey(
        cp.CreateApiKeyRequest(tenant_id="plain", name="k"), metadata=recorded.op_md
    )
    await wait_for(lambda: bool(scheduler.of_kind("cluster_state")), what="the first snapshot")
    [first_state] = scheduler.of_kind("cluster_state")
    assert list(first_state.cluster_state.tenant_policies) == []

    stored = await recorded.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(policy=common_pb2.TenantPolicy(tenant_id="gold", weight=5)),
        metadata=recorded.op_md,
    )
    await wait_for(lambda: bool(scheduler.of_kind("tenant_policies")), what="the policy pushed")
    [pushed] = scheduler.of_kind("tenant_policies")
    assert list(pushed.tenant_policies.policies) == [stored]

    scheduler.hang_up()
    await wait_for(
        lambda: len(scheduler.of_kind("cluster_state")) == 2, what="the replay on reconnect"
    )
    assert scheduler.connects == 2
    replayed = scheduler.of_kind("cluster_state")[-1].cluster_state
    # Only a stored policy: "plain" has the defaults and nothing to push.
    assert list(replayed.tenant_policies) == [stored]


async def test_the_queue_snapshot_is_the_scheduler_s_own_and_unavailable_without_it(
    recorded: Recorded,
):
    request = scheduler_pb2.GetQueueSnapshotRequest()
    assert await recorded.operator.GetQueueSnapshot(request, metadata=recorded.op_md) == SNAPSHOT
    await recorded.scheduler_server.stop(grace=0.1)
    assert await refusal(recorded.operator.GetQueueSnapshot(request, metadata=recorded.op_md)) == (
        grpc.StatusCode.UNAVAILABLE,
        "SCHEDULER_UNAVAILABLE",
        "",
    )


async def test_a_new_tenant_named_by_several_writers_at_once_is_created_once(
    gantry: Harness,
) -> None:
    """CreateApiKey and SetTenantPolicy both create a tenant on first use: at the same moment,
    every call succeeds and there is one tenant."""
    calls = [
        gantry.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="racer", name=f"key-{i}"), metadata=gantry.op_md
        )
        for i in range(3)
    ] + [
        gantry.operator.SetTenantPolicy(
            cp.SetTenantPolicyRequest(policy=common_pb2.TenantPolicy(tenant_id="racer", weight=2)),
            metadata=gantry.op_md,
        )
    ]
    await asyncio.gather(*calls)
    policy = await gantry.operator.GetTenantPolicy(
        cp.GetTenantPolicyRequest(tenant_id="racer"), metadata=gantry.op_md
    )
    assert policy.weight == 2
    listed = await gantry.operator.ListTenants(cp.ListTenantsRequest(), metadata=gantry.op_md)
    assert [t.tenant_id for t in listed.tenants].count("racer") == 1
