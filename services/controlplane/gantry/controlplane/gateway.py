"""WorkerGateway.Connect: the control plane's end of each worker's outbound stream.

Hello binds the stream to one node generation; anything from an older generation is rejected and
nothing from it is committed. Results are committed idempotently and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf import duration_pb2, json_format

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.domain.transitions import NodeState
from gantry.controlplane.lifecycle import LEASE_SECONDS, DeploymentLifecycle, scheduler_node
from gantry.controlplane.persistence import jobs, nodes
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.scheduler_link import SchedulerLink
from gantry.controlplane.worker_sessions import WorkerHub, WorkerSession
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1 import worker_gateway_pb2_grpc

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0


class WorkerGatewayService(worker_gateway_pb2_grpc.WorkerGatewayServicer):
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        lifecycle: DeploymentLifecycle,
        scheduler: SchedulerLink,
        clock: Clock,
    ) -> None:
        self._database = database
        self._hub = hub
        self._lifecycle = lifecycle
        self._scheduler = scheduler
        self._clock = clock

    async def Connect(
        self,
        request_iterator: AsyncIterator[wg.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[wg.ControlMessage]:
        node_id = current_principal().subject
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        if first.WhichOneof("kind") != "hello":
            raise GantryError("INVALID_ARGUMENT", "the first message on a worker stream is Hello")
        if first.node_id and first.node_id != node_id:
            raise GantryError("PERMISSION_DENIED", "Hello names another node than the credential")
        session = WorkerSession(node_id=node_id, generation=first.generation)
        welcome = await self._hello(session, first.hello)
        self._hub.attach(session)
        yield wg.ControlMessage(welcome=welcome)
        await self._lifecycle.dispatch_queued(node_id)

        reader = asyncio.create_task(self._read(session, request_iterator), name=f"read-{node_id}")
        try:
            while (message := await session.outbox.get()) is not None:
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await self._goodbye(session)

    async def _hello(self, session: WorkerSession, hello: wg.Hello) -> wg.Welcome:
        if session.generation <= 0:
            raise GantryError("INVALID_ARGUMENT", "a worker generation must be positive")
        now = self._clock.now()
        adapters = sorted({a for env in hello.environments for a in env.adapters})
        async with self._database.transaction() as db:
            node = await nodes.get_node(db, session.node_id)
            if node.state == NodeState.DISABLED:
                raise GantryError("NODE_DISABLED", f"node {node.node_id} is disabled")
            if session.generation < node.generation:
                raise GantryError(
                    "STALE_GENERATION",
                    f"generation {session.generation} is older than {node.generation}",
                    node_id=node.node_id,
                )
            if session.generation > node.generation and node.generation:
                # A new worker process: the old one's unfinished jobs go back to the queue.
                await jobs.release_generation_jobs(
                    db, node_id=node.node_id, generation=node.generation, now=now
                )
            inventory = {
                "adapters": adapters,
                "inventory": json_format.MessageToDict(hello.inventory),
                "environments": [json_format.MessageToDict(e) for e in hello.environments],
            }
            await nodes.mark_connected(
                db,
                node,
                generation=session.generation,
                hostname=hello.hostname,
                inventory=inventory,
                now=now,
            )
            changed, adopted, unload = await self._lifecycle.reconcile_node(
                db,
                node_id=node.node_id,
                generation=session.generation,
                inventory=hello.inventory,
                now=now,
            )
        self._scheduler.node_changed(
            scheduler_node(session.node_id, session.generation, inventory, {session.node_id})
        )
        self._lifecycle.announce(changed)
        log.info(
            "node %s connected, generation %d, adopted %d, unloading %d",
            session.node_id,
            session.generation,
            len(adopted),
            len(unload),
        )
        return wg.Welcome(
            node_id=session.node_id,
            accepted_generation=session.generation,
            heartbeat_interval=duration_pb2.Duration(seconds=int(HEARTBEAT_SECONDS)),
            adopted_deployment_ids=adopted,
            unload_deployment_ids=unload,
        )

    async def _read(
        self, session: WorkerSession, messages: AsyncIterator[wg.WorkerMessage]
    ) -> None:
        try:
            async for message in messages:
                if session.closed:
                    return
                if message.generation != session.generation:
                    session.send(
                        _reject(
                            "",
                            GantryError(
                                "STALE_GENERATION",
                                f"message from generation {message.generation}, stream holds "
                                f"{session.generation}",
                            ),
                        )
                    )
                    continue
                await self._handle(session, message)
        except grpc.aio.AioRpcError:
            pass
        except Exception:
            log.exception("worker stream of node %s failed", session.node_id)
        finally:
            session.close(
                GantryError("WORKER_UNAVAILABLE", f"lost the stream to node {session.node_id}")
            )

    async def _handle(self, session: WorkerSession, message: wg.WorkerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "invoke_result":
            session.resolve_invoke(message.invoke_result)
        elif kind == "heartbeat":
            await self._heartbeat(session, message.heartbeat)
        elif kind == "job_result":
            await self._job_result(session, message.job_result)
        elif kind == "job_update":
            log.info("job %s: %s", message.job_update.job_id, message.job_update.progress)
        elif kind == "inventory_report":
            await self._inventory(session, message.inventory_report.inventory)
        else:
            session.send(
                _reject("", GantryError("INVALID_ARGUMENT", f"unexpected worker message {kind!r}"))
            )

    async def _heartbeat(self, session: WorkerSession, heartbeat: wg.Heartbeat) -> None:
        now = self._clock.now()
        async with self._database.transaction() as db:
            await jobs.renew_leases(
                db,
                node_id=session.node_id,
                generation=session.generation,
                job_ids=list(heartbeat.active_job_ids),
                lease_seconds=LEASE_SECONDS,
                now=now,
            )
            node = await nodes.get_node(db, session.node_id)
            if node.generation == session.generation:
                node.last_seen_at = now

    async def _job_result(self, session: WorkerSession, result: wg.JobResult) -> None:
        try:
            await self._lifecycle.apply_result(
                node_id=session.node_id, generation=session.generation, result=result
            )
        except GantryError as error:
            log.warning("job result %s refused: %s", result.job_id, error)
            session.send(_reject(result.job_id, error))
            return
        session.send(wg.ControlMessage(ack=wg.Ack(job_id=result.job_id)))

    async def _inventory(self, session: WorkerSession, inventory: wg.Inventory) -> None:
        now = self._clock.now()
        async with self._database.transaction() as db:
            changed, _, _ = await self._lifecycle.reconcile_node(
                db,
                node_id=session.node_id,
                generation=session.generation,
                inventory=inventory,
                now=now,
            )
        self._lifecycle.announce(changed)

    async def _goodbye(self, session: WorkerSession) -> None:
        session.close(GantryError("WORKER_UNAVAILABLE", f"node {session.node_id} disconnected"))
        if not self._hub.detach(session):
            return  # a newer generation already holds the node
        now = self._clock.now()
        try:
            async with self._database.transaction() as db:
                await nodes.mark_disconnected(
                    db, session.node_id, generation=session.generation, now=now
                )
        except GantryError as error:
            log.warning("could not mark node %s disconnected: %s", session.node_id, error)
        self._scheduler.node_changed(scheduler_node(session.node_id, session.generation, {}, set()))
        log.info("node %s (generation %d) disconnected", session.node_id, session.generation)


def _reject(job_id: str, error: GantryError) -> wg.ControlMessage:
    return wg.ControlMessage(reject=wg.Reject(job_id=job_id, failure=error.to_failure()))
