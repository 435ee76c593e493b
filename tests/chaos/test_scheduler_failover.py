"""The active scheduler killed (SIGKILL) and then stopped (SIGSTOP) under steady Embed load from
clients using the documented settings (`client_channel`: round robin, idempotent calls retried
on UNAVAILABLE): every call succeeds, or fails typed SCHEDULER_UNAVAILABLE and then succeeds on
the client's next try; the control plane moves to the standby named by its leader, and the time
from the fault to the first call dispatched afterwards is measured (printed, never bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.client_config import client_channel
from gantry.common.status import error_info_of
from gantry.v1 import inference_pb2, inference_pb2_grpc
from tests.chaos.cluster import Cluster, Service, wait_until
from tests.chaos.conftest import started

CAPABILITY = "steady"
CLIENTS = 4
# A client's own deadline per call: room for a failover held in the control plane (the silence
# timeout, the leader's move, the hold) on top of a retried attempt.
CALL_DEADLINE_S = 15.0
RECOVERY_DEADLINE_S = 60.0


@dataclass(frozen=True)
class Call:
    client: int
    started: float
    ended: float
    reason: str  # "" when answered; else the ErrorInfo reason ("untyped" when there was none)


@dataclass
class SteadyLoad:
    """CLIENTS loops, each calling Embed back to back; a failed call is retried by the loop's
    next call (the client's own retry, after gRPC's transparent ones)."""

    stub: inference_pb2_grpc.InferenceStub
    api_key: str
    calls: list[Call] = field(default_factory=list)

    async def _call(self, client: int) -> None:
        started = time.monotonic()
        reason = ""
        try:
            await self.stub.Embed(
                inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=[f"client {client}"]),
                metadata=auth_metadata(self.api_key),
                timeout=CALL_DEADLINE_S,
            )
        except grpc.aio.AioRpcError as error:
            info = error_info_of(error)
            reason = info.reason if info is not None else f"untyped {error.code().name}"
        self.calls.append(Call(client, started, time.monotonic(), reason))

    async def client(self, client: int, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._call(client)

    def answered_since(self, moment: float) -> int:
        return sum(1 for c in self.calls if c.started >= moment and not c.reason)

    def first_answer_after(self, moment: float) -> float:
        """Seconds from `moment` to the end of the first answered call started after it."""
        return min(c.ended for c in self.calls if c.started >= moment and not c.reason) - moment

    def failures(self) -> list[Call]:
        return [c for c in self.calls if c.reason]

    def assert_truthful(self) -> None:
        """Only typed SCHEDULER_UNAVAILABLE failures, and each client's last call answered (every
        failure was followed by a success on that client's next tries)."""
        wrong = [c for c in self.failures() if c.reason != "SCHEDULER_UNAVAILABLE"]
        assert not wrong, f"calls failed otherwise than SCHEDULER_UNAVAILABLE: {wrong}"
        for client in range(CLIENTS):
            last = [c for c in self.calls if c.client == client][-1]
            assert not last.reason, f"client {client} ended on a failure: {last}"


@contextlib.asynccontextmanager
async def steady_load(cluster: Cluster) -> AsyncIterator[SteadyLoad]:
    channel = client_channel([f"127.0.0.1:{cluster.control_plane_port}"], asynchronous=True)
    load = SteadyLoad(inference_pb2_grpc.InferenceStub(channel), cluster.api_key)
    stop = asyncio.Event()
    clients = [asyncio.create_task(load.client(n, stop)) for n in range(CLIENTS)]
    try:
        yield load
    finally:
        stop.set()
        await asyncio.gather(*clients)
        await channel.close()


async def assignment(cluster: Cluster) -> tuple[str, int]:
    """The scheduler_assignment row, read straight from the database (no RPC shows it)."""
    dsn = cluster.database_url.replace("postgresql+asyncpg://", "postgresql://")
    connection = await asyncpg.connect(dsn, timeout=5)
    try:
        row = await connection.fetchrow("SELECT address, epoch FROM scheduler_assignment")
    finally:
        await connection.close()
    assert row is not None
    return str(row["address"]), int(row["epoch"])


async def fail_over(
    cluster: Cluster, load: SteadyLoad, active: Service, fault: signal.Signals, to_port: int
) -> tuple[float, int]:
    """Send `fault` to the active scheduler under load; wait until the row names the scheduler
    on `to_port` and calls are answered again. Seconds to the first call answered after the
    fault, and the new epoch."""
    _, epoch = await assignment(cluster)
    answered = len(load.calls)
    await wait_until(lambda: len(load.calls) >= answered + 20, timeout_s=30, what="steady load")
    active.send(fault)
    faulted_at = time.monotonic()
    wanted = (f"127.0.0.1:{to_port}", epoch + 1)

    async def moved() -> bool:
        return await assignment(cluster) == wanted

    await wait_until(moved, timeout_s=RECOVERY_DEADLINE_S, what=f"the assignment {wanted}")
    await wait_until(
        lambda: load.answered_since(faulted_at) >= 20,
        timeout_s=RECOVERY_DEADLINE_S,
        what="calls answered after the fault",
        last=lambda: load.calls[-1:],
    )
    return load.first_answer_after(faulted_at), epoch + 1


@pytest.fixture
async def failover_cluster(
    postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """Two schedulers, the control plane given both, one worker."""
    async with started(
        Cluster(database_url=postgres_url, root=tmp_path, standby_schedulers=1), request
    ) as cluster:
        yield cluster


@pytest.mark.timeout(240)
async def test_killed_then_stopped_active_scheduler_fails_over_under_steady_load(
    failover_cluster: Cluster, tiny_model_dir: Path
) -> None:
    cluster = failover_cluster
    assert cluster.scheduler is not None
    first, (standby,) = cluster.scheduler, cluster.standbys
    first_port, (standby_port,) = cluster.scheduler_port, cluster.standby_ports
    deployment_id = await cluster.register_and_deploy(tiny_model_dir, CAPABILITY)
    await cluster.wait_ready(deployment_id, timeout_s=90)
    assert await assignment(cluster) == (f"127.0.0.1:{first_port}", 1)

    async with steady_load(cluster) as load:
        killed_s, _ = await fail_over(cluster, load, first, signal.SIGKILL, standby_port)
        # The killed one comes back as the standby (same port); then the active one stops.
        await first.wait_exit(5)
        first.start()
        await cluster.wait_serving(first, first_port)
        stopped_s, epoch = await fail_over(cluster, load, standby, signal.SIGSTOP, first_port)
        # The stopped one resumes: no row names it, so every call stays on the first.
        standby.send(signal.SIGCONT)
        resumed_at = time.monotonic()
        await wait_until(
            lambda: load.answered_since(resumed_at) >= 20,
            timeout_s=RECOVERY_DEADLINE_S,
            what="calls answered after SIGCONT",
        )
        assert await assignment(cluster) == (f"127.0.0.1:{first_port}", epoch)

    load.assert_truthful()
    await cluster.wait_invariants_hold()
    print(
        f"\n[failover] {len(load.calls)} calls from {CLIENTS} clients, "
        f"{len(load.failures())} failed SCHEDULER_UNAVAILABLE and succeeded on the next try; "
        f"first call answered {killed_s:.2f}s after SIGKILL of the active scheduler, "
        f"{stopped_s:.2f}s after SIGSTOP of the next"
    )
