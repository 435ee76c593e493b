"""Plays the control plane's end of Scheduler.Connect over a real channel, for the scheduler's
stream tests: send inputs, read outputs one by one (batches unpacked), wait on a barrier."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import grpc

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
GIB = 1024**3
READ_TIMEOUT = 5.0


class Driver:
    """Plays the control plane's end of Scheduler.Connect."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub) -> None:
        self._inbox: asyncio.Queue[scheduler_pb2.SchedulerInput | None] = asyncio.Queue()
        self._pending: deque[scheduler_pb2.SchedulerOutput] = deque()
        self.call = stub.Connect(self._inputs(), metadata=auth_metadata(TOKEN))

    async def _inputs(self) -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        while (message := await self._inbox.get()) is not None:
            yield message

    def send(self, **kind: object) -> None:
        self._inbox.put_nowait(scheduler_pb2.SchedulerInput(**kind))  # type: ignore[arg-type]

    def submit(
        self, work_id: str, tenant: str, *, cost: int = 1, timeout: float = 0.0, dep: str = "d1"
    ) -> None:
        self.send(
            work_submitted=scheduler_pb2.WorkSubmitted(
                work_id=work_id,
                tenant_id=tenant,
                deployment_id=dep,
                cost=cost,
                timeout_seconds=timeout,
            )
        )

    def finish(self, work_id: str, outcome: int = scheduler_pb2.WORK_OUTCOME_SUCCESS) -> None:
        self.send(work_finished=scheduler_pb2.WorkFinished(work_id=work_id, outcome=outcome))

    async def read(self) -> scheduler_pb2.SchedulerOutput:
        """The next output, a batch's outputs one by one."""
        if not self._pending:
            output = await asyncio.wait_for(self.call.read(), READ_TIMEOUT)
            assert output is not grpc.aio.EOF
            if output.WhichOneof("kind") == "batch":
                self._pending.extend(output.batch.outputs)
            else:
                self._pending.append(output)
        return self._pending.popleft()

    async def read_kind(self, kind: str) -> scheduler_pb2.SchedulerOutput:
        """The next output of `kind`, skipping breaker events and advice."""
        while True:
            output = await self.read()
            if output.WhichOneof("kind") == kind:
                return output
            assert output.WhichOneof("kind") in ("breaker_changed", "scale_advice"), output

    async def barrier(self) -> None:
        """Wait until the scheduler has applied everything sent so far: it answers inputs in
        order, so the answer to a placement nothing can take comes after them."""
        self.send(
            place_deployment=scheduler_pb2.PlaceDeployment(
                request_id="barrier", deployment_id="none", required_labels=["no-such-label"]
            )
        )
        answer = await self.read_kind("rejected")
        assert answer.rejected.work_id == "barrier", answer

    def close(self) -> None:
        self._inbox.put_nowait(None)

    async def closed(self) -> list[scheduler_pb2.SchedulerOutput]:
        """Close the input side and wait for the scheduler to end the stream: what it still sent
        before the end (batches unpacked)."""
        self.close()
        left = list(self._pending)
        self._pending.clear()
        while True:
            output = await asyncio.wait_for(self.call.read(), READ_TIMEOUT)
            if output is grpc.aio.EOF:
                return left
            assert isinstance(output, scheduler_pb2.SchedulerOutput)
            left.extend(output.batch.outputs if output.WhichOneof("kind") == "batch" else [output])


def cluster(
    *residencies: tuple[str, str, int], policies: list[common_pb2.TenantPolicy] | None = None
) -> scheduler_pb2.ClusterState:
    """(residency id, node id, slots) each of deployment d1."""
    nodes = sorted({node for _, node, _ in residencies} | {"n1"})
    return scheduler_pb2.ClusterState(
        nodes=[
            scheduler_pb2.SchedulerNode(
                node_id=n,
                state=common_pb2.NODE_STATE_CONNECTED,
                labels=["adapter:st", "device:cpu"],
                domains=[
                    common_pb2.ResourceDomain(
                        name="host.ram",
                        kind=common_pb2.RESOURCE_KIND_RAM,
                        capacity_bytes=16 * GIB,
                        safety_margin_bytes=GIB,
                    )
                ],
            )
            for n in nodes
        ],
        residencies=[
            scheduler_pb2.SchedulerResidency(
                residency_id=rid,
                deployment_id="d1",
                node_id=node,
                state=common_pb2.RESIDENCY_STATE_RESIDENT,
                slots=slots,
                claims=[common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_RAM, bytes=GIB)],
            )
            for rid, node, slots in residencies
        ],
        tenant_policies=policies or [],
    )
