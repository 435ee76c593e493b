"""Two control-plane replicas on one PostgreSQL database, under steady Embed load from clients
using the documented settings (`client_channel` over both replicas: round robin, idempotent
calls retried on UNAVAILABLE), faulted with real signals:

A. the follower SIGKILLed (and restarted: it rejoins, its worker stream back);
B. the leader SIGKILLed: the other replica leads at the next epoch and places a deployment
   created right after the kill (the time from the kill to each is printed, never bounded);
C. the leader SIGSTOPped: PostgreSQL's idle_session_timeout ends its lock, the follower leads
   within the lease and places what is created meanwhile; after SIGCONT the old leader says it
   lost leadership and nothing is decided twice.

Each case is a test of its own, on a cluster of its own.

No case loses a call: a call in flight on a killed replica is retried on the other by the
channel, and one held by a stopped replica too, once the channel's keepalive finds the replica
silent (an unanswered ping: `client_config.CLIENT_KEEPALIVE`, within 3 s). After each
case every deployment has one LOAD job per residency and `CheckInvariants` holds through every
live replica. The active scheduler's kill and stop are tests/chaos/test_scheduler_failover.py.

Case C found a product bug (the resumed replica applied inventories read late, taken before the
other replica's LOAD result, and loaded a resident residency again), fixed: a late inventory is
judged only against records no newer message of its worker changed (nodes/inventory_rules.py
`Stamp`). Case A found another (a replica without the node's stream opened the node's breaker
for every replica), fixed (nodes/sessions.py `NoStreamHere`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from gantry.common.client_config import client_channel
from gantry.v1 import common_pb2, inference_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from tests.chaos.cluster import CHANNEL_OPTIONS, CallOutcome, Cluster, Service, wait_until
from tests.chaos.conftest import started

pytestmark = pytest.mark.postgres

CAPABILITY = "steady"
CLIENTS = 4
# The client's deadline per call: longer than the keepalive takes to find a stopped replica (3 s)
# and retry its calls on the other (case C).
CALL_DEADLINE_S = 5.0
# Answered calls each phase waits for: load that really ran across the fault.
CALLS_PER_PHASE = 20
RECOVERY_DEADLINE_S = 60.0
LABEL = re.compile(r'(\w+)="([^"]*)"')  # one label of a Prometheus sample line


class CallsLost(AssertionError):
    """Client calls failed across a fault that should lose none."""


class DecidedTwice(AssertionError):
    """A residency was loaded twice, or a deployment placed beyond its replicas."""


@dataclass(frozen=True)
class Leadership:
    """The control_plane_leadership row: the epoch and the pid of the replica holding it."""

    epoch: int
    holder_pid: int


class Plane:
    """What the replicas agree on, read straight from the database (no RPC shows it)."""

    def __init__(self, connection: asyncpg.Connection, node_id: str) -> None:
        self._connection = connection
        self._node_id = node_id

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, cluster: Cluster) -> AsyncIterator[Plane]:
        dsn = cluster.database_url.replace("postgresql+asyncpg://", "postgresql://")
        connection = await asyncpg.connect(dsn, timeout=5)
        try:
            yield cls(connection, cluster.node_id)
        finally:
            await connection.close()

    async def leadership(self) -> Leadership:
        row = await self._connection.fetchrow("SELECT epoch, holder FROM control_plane_leadership")
        assert row is not None
        # holder: host/pid/nonce (leadership.replica_name)
        return Leadership(int(row["epoch"]), int(str(row["holder"]).split("/")[1]))

    async def stream_pids(self) -> set[int]:
        """The replicas (by pid) holding a stream of this node (node_streams.replica_id is
        host/pid/nonce too)."""
        rows = await self._connection.fetch(
            "SELECT replica_id FROM node_streams WHERE node_id = $1", self._node_id
        )
        return {int(str(row["replica_id"]).split("/")[1]) for row in rows}


@dataclass
class SteadyLoad:
    """CLIENTS loops calling Embed back to back on one channel over every replica, each call
    recorded in the cluster's ledger under the phase current when it started."""

    cluster: Cluster
    stub: inference_pb2_grpc.InferenceStub
    phase: str = "warm-up"
    last: dict[int, CallOutcome] = field(default_factory=dict)  # each client's latest call

    def enter(self, phase: str) -> None:
        self.phase = phase

    async def client(self, client: int, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.last[client] = await self.cluster.embed(
                CAPABILITY,
                phase=self.phase,
                inputs=[f"client {client}"],
                timeout_s=CALL_DEADLINE_S,
                stub=self.stub,
            )

    def outcomes(self, phase: str) -> list[CallOutcome]:
        return [o for o in self.cluster.ledger.outcomes if o.phase == phase]

    def answered(self, phase: str) -> int:
        return sum(o.ok for o in self.outcomes(phase))

    async def wait_answered(self, phase: str, count: int = CALLS_PER_PHASE) -> None:
        await wait_until(
            lambda: self.answered(phase) >= count,
            timeout_s=RECOVERY_DEADLINE_S,
            what=f"{count} calls answered in {phase!r}",
            last=lambda: self.cluster.ledger.outcomes[-1:],
        )


@contextlib.asynccontextmanager
async def steady_load(cluster: Cluster) -> AsyncIterator[SteadyLoad]:
    # The documented settings, and the cluster's reconnect backoff (a caller's option) so that
    # a restarted replica is dialled again within half a second.
    channel = client_channel(
        cluster.control_plane_addresses, options=CHANNEL_OPTIONS, asynchronous=True
    )
    load = SteadyLoad(cluster, inference_pb2_grpc.InferenceStub(channel))
    stop = asyncio.Event()
    clients = [asyncio.create_task(load.client(n, stop)) for n in range(CLIENTS)]
    try:
        yield load
    finally:
        stop.set()
        await asyncio.gather(*clients)
        await channel.close()


def answers_of(cluster: Cluster, service: Service) -> Counter[str]:
    """The Embed calls of the load's capability this replica answered, by gRPC code and reason,
    from its /metrics (gantry_invocations)."""
    url = f"http://127.0.0.1:{cluster.metrics_ports[service.role]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    answers: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("gantry_invocations_total{") and f'capability="{CAPABILITY}"' in line:
            labels = dict(LABEL.findall(line))
            answers[f"{labels['code']} {labels['reason']}".strip()] += int(float(line.split()[-1]))
    return answers


def answered_by(cluster: Cluster, service: Service) -> int:
    return answers_of(cluster, service)["OK"]


async def wait_serving_calls(cluster: Cluster, service: Service) -> None:
    """The load's channel reaches `service`: its count of answered calls rises."""
    before = await asyncio.to_thread(answered_by, cluster, service)

    async def rose() -> bool:
        return await asyncio.to_thread(answered_by, cluster, service) >= before + 3

    await wait_until(rose, timeout_s=30, what=f"{service.role} answering the load's calls")


def replicas_of(cluster: Cluster) -> list[Service]:
    assert cluster.control_plane is not None
    return [cluster.control_plane, *cluster.replicas]


def port_of(cluster: Cluster, service: Service) -> int:
    ports = [cluster.control_plane_port, *cluster.replica_ports]
    by_role = {s.role: port for s, port in zip(replicas_of(cluster), ports, strict=True)}
    return by_role[service.role]


def log_after(service: Service, offset: int) -> str:
    return service.log_path.read_text(encoding="utf-8", errors="replace")[offset:]


def log_size(service: Service) -> int:
    return len(service.log_path.read_text(encoding="utf-8", errors="replace"))


async def rejoin(cluster: Cluster, plane: Plane, service: Service) -> None:
    """Restart a replica on its port: it serves, the worker's stream to it is back, and the
    load's channel reaches it again."""
    await service.wait_exit(5)
    service.start()
    await cluster.wait_serving(service, port_of(cluster, service))

    async def streamed() -> bool:
        return service.pid in await plane.stream_pids()

    await wait_until(streamed, timeout_s=30, what=f"the worker's stream to {service.role}")
    await wait_serving_calls(cluster, service)


async def history(cluster: Cluster, deployment_id: str) -> str:
    """A deployment's state transitions and its residencies' and jobs', one line each."""
    listed = await cluster.operator.ListStateTransitions(
        cp.ListStateTransitionsRequest(
            subject_kind="deployment", subject_id=deployment_id, page_size=200
        ),
        metadata=cluster.op_md,
        timeout=5,
    )
    return "\n".join(
        f"  {t.at.ToJsonString()} {t.subject_kind} {t.subject_id[:8]} {t.from_state or '-'} -> "
        f"{t.to_state} {t.reason} {t.message}"
        for t in listed.transitions
    )


async def assert_decided_once(cluster: Cluster) -> None:
    """One LOAD per residency, and no deployment holds more residencies than its replicas."""
    for deployment_id in cluster.deployment_ids:
        loads = [
            job.residency_id
            for job in await cluster.jobs(deployment_id)
            if job.job_type == cp.SERVING_JOB_TYPE_LOAD
        ]
        if len(loads) != len(set(loads)):
            raise DecidedTwice(
                f"a residency loaded twice: {deployment_id} {loads}; its history:\n"
                + await history(cluster, deployment_id)
            )
        deployment = await cluster.deployment(deployment_id)
        live = [r for r in deployment.residencies if r.state != common_pb2.RESIDENCY_STATE_COLD]
        if len(live) > deployment.replicas:
            raise DecidedTwice(f"placed beyond its replicas: {deployment}")


async def assert_invariants_everywhere(cluster: Cluster, live: list[Service]) -> None:
    for service in live:
        cluster.use_replica(port_of(cluster, service))
        await cluster.wait_invariants_hold()
        await assert_decided_once(cluster)


async def create_and_time_placement(
    cluster: Cluster, approval_id: str, capability: str, since: float
) -> tuple[str, float]:
    """A deployment created (through the cluster's current replica) from the approval the load's
    deployment passed; seconds from `since` to its placement decision (a residency recorded)."""
    created = await cluster.operator.CreateDeployment(
        cp.CreateDeploymentRequest(approval_id=approval_id, capability=capability),
        metadata=cluster.op_md,
        timeout=10,
    )
    cluster.deployment_ids.append(created.deployment_id)
    await cluster.wait_deployment(
        created.deployment_id,
        lambda d: bool(d.residencies),
        timeout_s=RECOVERY_DEADLINE_S,
        what=f"{capability} placed",
    )
    return created.deployment_id, time.monotonic() - since


async def wait_leader(plane: Plane, epoch: int, service: Service) -> float:
    wanted = Leadership(epoch, service.pid)
    latest: list[Leadership] = []

    async def led() -> bool:
        latest[:] = [await plane.leadership()]
        return latest[0] == wanted

    return await wait_until(
        led, timeout_s=RECOVERY_DEADLINE_S, what=f"leadership {wanted}", last=lambda: latest
    )


@pytest.fixture
async def replicas_cluster(
    postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """One scheduler, two control-plane replicas given it, one worker streaming to both."""
    async with started(
        Cluster(database_url=postgres_url, root=tmp_path, control_planes=2), request
    ) as cluster:
        yield cluster


@dataclass
class Chaos:
    """One test's cluster, database view and load, and the figures it prints."""

    cluster: Cluster
    plane: Plane
    load: SteadyLoad
    approval_id: str

    def say(self, line: str) -> None:
        print(f"\n[replicas] {line}")

    async def leader_and_follower(self) -> tuple[Leadership, Service, Service]:
        now = await self.plane.leadership()
        [leader] = [s for s in replicas_of(self.cluster) if s.pid == now.holder_pid]
        [follower] = [s for s in replicas_of(self.cluster) if s.pid != now.holder_pid]
        return now, leader, follower

    def lost(self, *phases: str) -> list[CallOutcome]:
        return [o for phase in phases for o in self.load.outcomes(phase) if not o.ok]


def summary(failed: list[CallOutcome]) -> str:
    """How many failed, by code and reason, and the first two in full (a fault can fail
    hundreds)."""
    kinds = Counter(f"{o.code.name} {o.reason or '(no reason)'}" for o in failed)
    return f"{len(failed)} calls: {dict(kinds)}; first: {failed[:2]}"


async def case_a_kill_follower(chaos: Chaos) -> None:
    """The follower SIGKILLed: no call lost, the leader unmoved; restarted, it rejoins (serves,
    holds the worker's stream again) and still no call is lost."""
    before, leader, follower = await chaos.leader_and_follower()
    killed, rejoining = "A: follower killed", "A: follower rejoining"
    chaos.load.enter(killed)
    follower.send(signal.SIGKILL)
    await chaos.load.wait_answered(killed)
    assert await chaos.plane.leadership() == before, "a follower's death moved the leadership"
    lost = chaos.lost(killed)
    assert not lost, f"calls failed when the follower died: {summary(lost)}"
    chaos.say(f"A follower SIGKILL: {len(chaos.load.outcomes(killed))} calls, 0 failed")
    chaos.load.enter(rejoining)
    await rejoin(chaos.cluster, chaos.plane, follower)
    await chaos.load.wait_answered(rejoining)
    await assert_invariants_everywhere(chaos.cluster, [leader, follower])
    lost = chaos.lost(rejoining)
    answers = await asyncio.to_thread(answers_of, chaos.cluster, follower)
    if lost:
        raise CallsLost(
            f"calls failed when the follower rejoined: {summary(lost)}; the restarted replica "
            f"answered {dict(answers)}"
        )
    chaos.say(f"A follower restarted: {len(chaos.load.outcomes(rejoining))} calls, 0 failed")


async def case_b_kill_leader(chaos: Chaos) -> None:
    """The leader SIGKILLed: the follower leads at the next epoch and places a deployment
    created through it right after the kill; no call lost, nothing loaded twice."""
    before, leader, follower = await chaos.leader_and_follower()
    cluster, phase = chaos.cluster, "B: leader killed"
    cluster.use_replica(port_of(cluster, follower))
    offset = log_size(follower)
    chaos.load.enter(phase)
    leader.send(signal.SIGKILL)
    killed_at = time.monotonic()
    placing = asyncio.create_task(
        create_and_time_placement(cluster, chaos.approval_id, "placed-after-kill", killed_at)
    )
    decider_s = await wait_leader(chaos.plane, before.epoch + 1, follower)
    deployment_id, placed_s = await placing
    assert f"leading (epoch {before.epoch + 1})" in log_after(follower, offset)
    await cluster.wait_ready(deployment_id, timeout_s=RECOVERY_DEADLINE_S)
    await chaos.load.wait_answered(phase)
    assert await chaos.plane.leadership() == Leadership(before.epoch + 1, follower.pid)
    await assert_invariants_everywhere(cluster, [follower])
    lost = chaos.lost(phase)
    assert not lost, f"calls failed when the leader died: {summary(lost)}"
    calls = len(chaos.load.outcomes(phase))
    chaos.say(
        f"B leader SIGKILL: new decider (epoch {before.epoch + 1}) {decider_s:.2f}s after the "
        f"kill, the placement decision {placed_s:.2f}s after the kill; {calls} calls, "
        f"{len(lost)} failed"
    )


async def case_c_stop_leader(chaos: Chaos) -> None:
    """The leader SIGSTOPped: PostgreSQL ends its lock session after the lease and the other
    replica leads and places; the calls the stopped one holds are retried on the other once
    the client's keepalive finds it silent; after SIGCONT it says it lost leadership and nothing
    is decided twice."""
    before, leader, follower = await chaos.leader_and_follower()
    cluster, stopped, resumed = chaos.cluster, "C: leader stopped", "C: leader resumed"
    assert not cluster.ledger.failures(), "calls failed before the stop"
    cluster.use_replica(port_of(cluster, follower))
    chaos.load.enter(stopped)
    leader.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    placing = asyncio.create_task(
        create_and_time_placement(cluster, chaos.approval_id, "placed-during-stop", stopped_at)
    )
    decider_s = await wait_leader(chaos.plane, before.epoch + 1, follower)
    deployment_id, placed_s = await placing
    await cluster.wait_ready(deployment_id, timeout_s=RECOVERY_DEADLINE_S)
    await chaos.load.wait_answered(stopped)
    offset = log_size(leader)
    chaos.load.enter(resumed)
    leader.send(signal.SIGCONT)
    await wait_until(
        lambda: f"lost leadership (epoch {before.epoch})" in log_after(leader, offset),
        timeout_s=RECOVERY_DEADLINE_S,
        what="the resumed replica saying it lost leadership",
    )
    # Judged once it has read what its streams queued while it was stopped: it answers calls.
    await wait_serving_calls(cluster, leader)
    await chaos.load.wait_answered(resumed)
    assert await chaos.plane.leadership() == Leadership(before.epoch + 1, follower.pid)
    await assert_invariants_everywhere(cluster, [follower, leader])
    # The calls the stopped replica held failed UNAVAILABLE at the client's keepalive, before
    # their deadline, and were retried on the other: none failed.
    failed = cluster.ledger.failures()
    assert not failed, f"calls failed across the stop: {summary(failed)}"
    calls = len(chaos.load.outcomes(stopped)) + len(chaos.load.outcomes(resumed))
    chaos.say(
        f"C leader SIGSTOP: new decider (epoch {before.epoch + 1}) {decider_s:.2f}s after the "
        f"stop, the placement decision {placed_s:.2f}s after the stop; {calls} calls, "
        f"{len(failed)} failed; after SIGCONT it logged lost leadership"
    )


@contextlib.asynccontextmanager
async def steady_chaos(cluster: Cluster, tiny_model_dir: Path) -> AsyncIterator[Chaos]:
    """The load's deployment READY, the worker streaming to both replicas, the steady load
    answered by both; on the way out, each client's last call was answered (every failure was
    followed by a success)."""
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, CAPABILITY)
    ready = await cluster.wait_ready(deployment_id, timeout_s=90)
    async with Plane.open(cluster) as plane:

        async def both_streamed() -> bool:
            return await plane.stream_pids() == {s.pid for s in replicas_of(cluster)}

        await wait_until(both_streamed, timeout_s=30, what="the worker streaming to both")
        async with steady_load(cluster) as load:
            for replica in replicas_of(cluster):
                await wait_serving_calls(cluster, replica)
            yield Chaos(cluster, plane, load, ready.approval_id)
    assert len(load.last) == CLIENTS and all(o.ok for o in load.last.values()), load.last


@pytest.mark.timeout(180)
async def test_leader_killed_under_load_hands_over_deciding(
    replicas_cluster: Cluster, tiny_model_dir: Path
) -> None:
    async with steady_chaos(replicas_cluster, tiny_model_dir) as chaos:
        await case_b_kill_leader(chaos)


# Found by this test, fixed: the restarted replica serves clients before the worker's stream
# reaches it, and the calls the scheduler dispatched to it there opened the node's breaker for
# every replica (WORKER_UNAVAILABLE counted on the node). Such a call is now NoStreamHere: the
# client retries it on the other replica, the scheduler hears CANCELLED.
@pytest.mark.timeout(180)
async def test_follower_killed_and_restarted_under_load_loses_no_call(
    replicas_cluster: Cluster, tiny_model_dir: Path
) -> None:
    async with steady_chaos(replicas_cluster, tiny_model_dir) as chaos:
        await case_a_kill_follower(chaos)


# Found by this test, fixed: on SIGCONT the old leader read the inventory its worker stream
# queued while it was stopped, taken before the new leader's LOAD, found the RESIDENT residency
# missing, marked it COLD and queued a second LOAD; the worker refused it ("already on this
# worker") and the deployment ended FAILED while its model host still ran. Every inventory and
# job result now carries the worker's sequence, and an inventory older than the message that last
# changed a residency says nothing about it (nodes/inventory_rules.py `Stamp`).
@pytest.mark.timeout(180)
async def test_leader_stopped_under_load_hands_over_deciding_once(
    replicas_cluster: Cluster, tiny_model_dir: Path
) -> None:
    async with steady_chaos(replicas_cluster, tiny_model_dir) as chaos:
        await case_c_stop_leader(chaos)
