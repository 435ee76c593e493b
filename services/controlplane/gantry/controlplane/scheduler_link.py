"""The control plane's end of the Scheduler.Connect stream: one open stream, replayed on reconnect.

Requests to the scheduler (dispatch this work, place this deployment) wait on a future keyed by
their id; the stream's reader resolves them. When the stream drops, every waiter fails with
SCHEDULER_UNAVAILABLE at once, and the link reconnects with backoff and replays the cluster state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from gantry.common.auth import auth_metadata
from gantry.common.errors import GantryError
from gantry.common.grpc_server import insecure_channel
from gantry.common.ids import new_id
from gantry.common.telemetry import inject_context
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

ClusterStateSource = Callable[[], Awaitable[scheduler_pb2.ClusterState]]
_CLOSE = object()


class SchedulerLink:
    def __init__(
        self,
        *,
        address: str,
        service_token: str,
        cluster_state: ClusterStateSource,
        reconnect_max_seconds: float = 5.0,
    ) -> None:
        self._address = address
        self._token = service_token
        self._cluster_state = cluster_state
        self._reconnect_max = reconnect_max_seconds
        self._outbox: asyncio.Queue[scheduler_pb2.SchedulerInput | object] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[scheduler_pb2.SchedulerOutput]] = {}
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scheduler-link")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_waiters("the control plane is stopping")

    async def wait_connected(self, timeout: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    # ---- requests -----------------------------------------------------------------------------

    async def dispatch(
        self, work: scheduler_pb2.WorkSubmitted, *, timeout: float
    ) -> scheduler_pb2.Dispatch:
        message = scheduler_pb2.SchedulerInput(work_submitted=work)
        output = await self._request(work.work_id, message, timeout=timeout)
        return output.dispatch

    def work_finished(self, work_id: str, outcome: scheduler_pb2.WorkOutcome) -> None:
        self._send(
            scheduler_pb2.SchedulerInput(
                work_finished=scheduler_pb2.WorkFinished(work_id=work_id, outcome=outcome)
            )
        )

    async def place(
        self, *, deployment_id: str, replicas: int, required_adapter: str, timeout: float = 10.0
    ) -> list[str]:
        request_id = new_id()
        message = scheduler_pb2.SchedulerInput(
            place_deployment=scheduler_pb2.PlaceDeployment(
                request_id=request_id,
                deployment_id=deployment_id,
                replicas=replicas,
                required_adapter=required_adapter,
            )
        )
        output = await self._request(request_id, message, timeout=timeout)
        return list(output.placement.node_ids)

    def node_changed(self, node: scheduler_pb2.SchedulerNode) -> None:
        self._send(scheduler_pb2.SchedulerInput(node_update=scheduler_pb2.NodeUpdate(node=node)))

    def residency_changed(self, residency: scheduler_pb2.SchedulerResidency) -> None:
        self._send(
            scheduler_pb2.SchedulerInput(
                residency_update=scheduler_pb2.ResidencyUpdate(residency=residency)
            )
        )

    def _send(self, message: scheduler_pb2.SchedulerInput) -> None:
        # State updates made while disconnected are covered by the snapshot sent on reconnect.
        if self.connected:
            self._outbox.put_nowait(message)

    async def _request(
        self, key: str, message: scheduler_pb2.SchedulerInput, *, timeout: float
    ) -> scheduler_pb2.SchedulerOutput:
        if not self.connected:
            raise GantryError("SCHEDULER_UNAVAILABLE", "the scheduler is not connected")
        inject_context(message.trace_context)
        future: asyncio.Future[scheduler_pb2.SchedulerOutput] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters[key] = future
        self._outbox.put_nowait(message)
        try:
            output = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise GantryError(
                "SCHEDULER_UNAVAILABLE", f"the scheduler did not answer within {timeout:.1f}s"
            ) from None
        finally:
            self._waiters.pop(key, None)
        if output.WhichOneof("kind") == "rejected":
            raise GantryError.from_failure(output.rejected.failure)
        return output

    # ---- the stream ---------------------------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._connect_once()
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                log.warning("scheduler stream ended: %s %s", error.code().name, error.details())
            except Exception:
                log.exception("scheduler stream failed")
            self._connected.clear()
            self._fail_waiters("the scheduler stream was lost")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._reconnect_max)

    async def _connect_once(self) -> None:
        async with insecure_channel(self._address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            self._outbox = asyncio.Queue()
            self._outbox.put_nowait(
                scheduler_pb2.SchedulerInput(cluster_state=await self._cluster_state())
            )
            call = stub.Connect(self._outgoing(), metadata=auth_metadata(self._token))
            self._connected.set()
            log.info("connected to the scheduler at %s", self._address)
            async for output in call:
                self._resolve(output)

    async def _outgoing(self) -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        outbox = self._outbox
        while True:
            message = await outbox.get()
            if message is _CLOSE:
                return
            assert isinstance(message, scheduler_pb2.SchedulerInput)
            yield message

    def _resolve(self, output: scheduler_pb2.SchedulerOutput) -> None:
        kind = output.WhichOneof("kind")
        if kind == "dispatch":
            key = output.dispatch.work_id
        elif kind == "rejected":
            key = output.rejected.work_id
        elif kind == "placement":
            key = output.placement.request_id
        else:
            log.error("unknown scheduler output %r", kind)
            return
        future = self._waiters.get(key)
        if future is not None and not future.done():
            future.set_result(output)

    def _fail_waiters(self, why: str) -> None:
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(GantryError("SCHEDULER_UNAVAILABLE", why))
