"""Scheduler bench: the pure core's decisions per second, dispatches through the real Connect
stream, and served shares against weights under saturation.

PERFORMANCE.md targets: >= 20,000 pure placement/dispatch decisions per second with 1,000 tenants
and 500 nodes on one core; >= 5,000 dispatches/s through the scheduler stream; served shares within
+-5 % of weights under saturation. Each figure is printed beside its baseline from the same run:
the bare fair queue (push + pop) for the core, the pure core for the stream.

GANTRY_BENCH_SCHEDULER_DECISIONS (default 60,000) sets the measured dispatch decisions.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, deque

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import insecure_channel
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.events import (
    Dispatched,
    NodeInfo,
    PlacementMade,
    PlacementRequest,
    ResidencyInfo,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.fair_queue import bench_fair_queue
from gantry.scheduler.policy.types import Claim, Domain, Outcome, ResourceKind, TenantPolicy
from gantry.scheduler.server import start_scheduler
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.bench.summary import Summary

DECISIONS = int(os.environ.get("GANTRY_BENCH_SCHEDULER_DECISIONS", "60000"))
TENANTS = 1_000
NODES = 500
DEPLOYMENTS = 100
SLOTS = 4
GIB = 1024**3
COMMAND = "make bench  (GANTRY_BENCH_SCHEDULER_DECISIONS to change the count)"


def _cluster(core: SchedulerCore, *, policies: list[TenantPolicy]) -> None:
    nodes = [
        NodeInfo(
            node_id=f"n{i:03d}",
            connected=True,
            labels=frozenset({"adapter:st", "device:cpu"}),
            domains=(
                Domain("host.ram", ResourceKind.RAM, 64 * GIB, 4 * GIB),
                Domain("gpu0.vram", ResourceKind.VRAM, 80 * GIB, 2 * GIB),
            ),
        )
        for i in range(NODES)
    ]
    residencies = [
        ResidencyInfo(
            residency_id=f"r{i:03d}",
            deployment_id=f"d{i % DEPLOYMENTS:03d}",
            node_id=f"n{i:03d}",
            phase=3,
            claims=(Claim(ResourceKind.RAM, 2 * GIB), Claim(ResourceKind.VRAM, 6 * GIB)),
            slots=SLOTS,
        )
        for i in range(NODES)
    ]
    core.load_cluster(
        nodes=nodes, residencies=residencies, deployments=[], policies=policies, now=0.0
    )


def bench_core_dispatch(dispatches: int) -> tuple[float, float]:
    """(dispatches/s wall, dispatches/s CPU) in a saturated steady state: 1,000 tenants, 500
    nodes, every slot busy and work waiting; each dispatch decision is one submit, one finish
    and the dispatch the freed slot makes (the inputs are drawn before the clock starts)."""
    rng = random.Random(7)
    core = SchedulerCore(CoreSettings(global_queue_depth=1_000_000, tenant_queue_depth=100_000))
    _cluster(core, policies=[TenantPolicy(f"t{i}", weight=1 + i % 4) for i in range(TENANTS)])
    backlog = NODES * SLOTS * 2  # every slot busy, as much again waiting
    inputs = [
        WorkRequest(
            work_id=f"w{i}",
            tenant_id=f"t{rng.randrange(TENANTS)}",
            deployment_id=f"d{rng.randrange(DEPLOYMENTS):03d}",
            priority=0,
            cost=rng.randrange(1, 2_000),
        )
        for i in range(backlog + dispatches)
    ]
    running: deque[str] = deque()
    for work in inputs[:backlog]:
        running.extend(d.work_id for d in core.submit(work, 0.0) if isinstance(d, Dispatched))
    made = 0
    now = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    for work in inputs[backlog:]:
        now += 0.0001
        for decision in core.submit(work, now):
            if isinstance(decision, Dispatched):
                made += 1
                running.append(decision.work_id)
        for decision in core.finish(running.popleft(), Outcome.SUCCESS, now):
            if isinstance(decision, Dispatched):
                made += 1
                running.append(decision.work_id)
    return made / (time.perf_counter() - wall), made / (time.process_time() - cpu)


def bench_core_placement(placements: int) -> float:
    core = SchedulerCore(CoreSettings(placement_hold_seconds=1e9))
    _cluster(core, policies=[])
    claims = (Claim(ResourceKind.RAM, 256 * 1024**2), Claim(ResourceKind.VRAM, 512 * 1024**2))
    start = time.process_time()
    for i in range(placements):
        decision = core.place(
            PlacementRequest(
                request_id=f"p{i}",
                deployment_id=f"new{i}",
                replicas=1,
                claims=claims,
                required_labels=frozenset({"adapter:st"}),
            ),
            float(i),
        )
        assert isinstance(decision, PlacementMade), decision
    return placements / (time.process_time() - start)


def bench_core_fairness(dispatches: int) -> float:
    """Ten tenants, weights 1..10, mixed costs, one slot saturated: the largest deviation of a
    tenant's served cost share from its weight share, relative to that weight share."""
    rng = random.Random(11)
    weights = {f"t{i}": i + 1 for i in range(10)}
    core = SchedulerCore(CoreSettings(global_queue_depth=100_000, tenant_queue_depth=100_000))
    core.load_cluster(
        nodes=[NodeInfo("n1", True, frozenset({"device:cpu"}))],
        residencies=[ResidencyInfo("r1", "d1", "n1", phase=3, slots=1)],
        deployments=[],
        policies=[TenantPolicy(t, weight=w) for t, w in weights.items()],
        now=0.0,
    )
    serial = 0
    waiting: Counter[str] = Counter()  # each tenant's queued work, kept >= 20: saturated
    tenant_of: dict[str, str] = {}

    def top_up(now: float) -> list[str]:
        nonlocal serial
        started = []
        for tenant in weights:
            while waiting[tenant] < 20:
                serial += 1
                work_id = f"w{serial}"
                tenant_of[work_id] = tenant
                waiting[tenant] += 1
                cost = rng.choice((10, 100, 1_000))
                for d in core.submit(WorkRequest(work_id, tenant, "d1", 0, cost), now):
                    assert not isinstance(d, WorkRejected), d
                    if isinstance(d, Dispatched):
                        started.append(d.work_id)
                        waiting[tenant_of[d.work_id]] -= 1
        return started

    running = top_up(0.0)
    for i in range(dispatches):
        (done,) = running
        decisions = core.finish(done, Outcome.SUCCESS, float(i))
        running = [d.work_id for d in decisions if isinstance(d, Dispatched)]
        for work_id in running:
            waiting[tenant_of[work_id]] -= 1
        running += top_up(float(i))
    loads = {t.tenant_id: t for t in core.snapshot(float(dispatches)).tenants}
    total_weight = sum(weights.values())
    worst = 0.0
    for tenant, weight in weights.items():
        share = loads[tenant].served_share
        worst = max(worst, abs(share - weight / total_weight) / (weight / total_weight))
    return worst


async def bench_stream(dispatches: int) -> float:
    """Dispatches per second through a real Connect stream: submit, dispatch, finish, with up to
    512 calls in flight from the driver (one process, one loop: both ends share the cores)."""
    token = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
    server, _ = await start_scheduler(
        listen="127.0.0.1:0",
        service_token=token,
        settings=None,
    )
    inbox: asyncio.Queue[scheduler_pb2.SchedulerInput | None] = asyncio.Queue()

    async def inputs():  # type: ignore[no-untyped-def]
        # Coalesce what is waiting into one stream message, as the control plane's link does.
        while (message := await inbox.get()) is not None:
            batch = [message]
            while not inbox.empty() and len(batch) < 256:
                more = inbox.get_nowait()
                if more is None:
                    break
                batch.append(more)
            if len(batch) == 1:
                yield message
            else:
                yield scheduler_pb2.SchedulerInput(batch=scheduler_pb2.InputBatch(inputs=batch))

    state = scheduler_pb2.ClusterState(
        nodes=[
            scheduler_pb2.SchedulerNode(
                node_id=f"n{i}", state=common_pb2.NODE_STATE_CONNECTED, labels=["device:cpu"]
            )
            for i in range(8)
        ],
        residencies=[
            scheduler_pb2.SchedulerResidency(
                residency_id=f"r{i}",
                deployment_id="d1",
                node_id=f"n{i}",
                state=common_pb2.RESIDENCY_STATE_RESIDENT,
                slots=64,
            )
            for i in range(8)
        ],
    )
    window = 512
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call = stub.Connect(inputs(), metadata=auth_metadata(token))
        inbox.put_nowait(scheduler_pb2.SchedulerInput(cluster_state=state))
        sent = 0

        def submitted() -> scheduler_pb2.SchedulerInput:
            nonlocal sent
            sent += 1
            return scheduler_pb2.SchedulerInput(
                work_submitted=scheduler_pb2.WorkSubmitted(
                    work_id=f"w{sent}", tenant_id=f"t{sent % 16}", deployment_id="d1", cost=64
                )
            )

        for _ in range(window):
            inbox.put_nowait(submitted())
        start = time.perf_counter()
        received = 0
        while received < dispatches:
            output = await call.read()
            # Whatever was decided together comes as one batch; the answers are coalesced by
            # inputs() as the control plane's link coalesces its outbox.
            outputs = output.batch.outputs if output.WhichOneof("kind") == "batch" else [output]
            replies = []
            for decided in outputs:
                assert decided.WhichOneof("kind") == "dispatch", decided
                received += 1
                replies.append(
                    scheduler_pb2.SchedulerInput(
                        work_finished=scheduler_pb2.WorkFinished(
                            work_id=decided.dispatch.work_id,
                            outcome=scheduler_pb2.WORK_OUTCOME_SUCCESS,
                        )
                    )
                )
                if sent < dispatches:
                    replies.append(submitted())
            for reply in replies:
                inbox.put_nowait(reply)
        rate = received / (time.perf_counter() - start)
        inbox.put_nowait(None)
        call.cancel()
    await server.stop(grace=0.1)
    return rate


async def main(summary: Summary | None = None) -> int:
    print(f"Scheduler bench ({TENANTS} tenants, {NODES} nodes); reproduce: {COMMAND}")
    baseline = bench_fair_queue(TENANTS, DECISIONS)
    wall_rate, cpu_rate = bench_core_dispatch(DECISIONS)
    print(
        f"  pure core, dispatch decisions: {wall_rate:9,.0f}/s wall, {cpu_rate:9,.0f}/s CPU "
        f"(target >= 20,000/s); baseline bare fair queue push+pop {baseline:9,.0f}/s "
        f"= core at {cpu_rate / baseline:.2f} of it"
    )
    placement_rate = bench_core_placement(2_000)
    print(f"  pure core, placement decisions (500 nodes, 2 domains): {placement_rate:9,.0f}/s CPU")
    stream_rate = await bench_stream(max(5_000, DECISIONS // 4))
    print(
        f"  through the Connect stream: {stream_rate:9,.0f} dispatches/s (target >= 5,000/s) "
        f"= {stream_rate / cpu_rate:.2f} of the pure core's rate"
    )
    worst = bench_core_fairness(20_000)
    print(
        f"  fairness, 10 tenants weights 1..10, saturated: the worst served share is "
        f"{worst * 100:.1f} % off its weight share (target within 5 %)"
    )
    if summary is not None:
        summary.add(
            "scheduler core, dispatch decisions/s (CPU)",
            f"{cpu_rate:,.0f}/s",
            f"bare fair queue {baseline:,.0f}/s",
            ">= 20,000/s",
            cpu_rate >= 20_000,
            "the bare fair queue alone (push + pop) sets the ceiling" if cpu_rate < 20_000 else "",
        )
        summary.add(
            "scheduler stream, dispatches/s",
            f"{stream_rate:,.0f}/s",
            f"pure core {cpu_rate:,.0f}/s",
            ">= 5,000/s",
            stream_rate >= 5_000,
        )
        summary.add(
            "fairness, worst share off its weight",
            f"{worst * 100:.1f} %",
            "weights 1..10",
            "within 5 %",
            worst <= 0.05,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
