"""A scripted worker: a real gRPC client of WorkerGateway.Connect whose answers a test decides.

It stands in for a worker agent where a test needs control over what the control plane hears
(a lost assignment, a failed unload, an inventory of its choosing) without real model hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

import grpc

from gantry.common.auth import auth_metadata
from gantry.common.digests import adapter_digest, environment_fingerprint
from gantry.v1 import common_pb2, worker_gateway_pb2_grpc
from gantry.v1 import worker_gateway_pb2 as wg

ENVIRONMENT = wg.RuntimeEnvironment(
    environment_id="default", python_executable="/scripted", adapters=["sentence_transformers"]
)
ENVIRONMENT_FINGERPRINT = environment_fingerprint(ENVIRONMENT)

JobAnswer = Callable[[wg.JobAssignment], wg.JobResult | None]


class ScriptedWorker:
    """Answers loads and unloads by default, holds invocations; every message is recorded."""

    def __init__(self, *, generation: int = 1) -> None:
        self.generation = generation
        self.outgoing: asyncio.Queue[wg.WorkerMessage | None] = asyncio.Queue()
        self.invokes: asyncio.Queue[wg.Invoke] = asyncio.Queue()
        self.cancels: asyncio.Queue[wg.CancelInvoke] = asyncio.Queue()
        self.assignments: list[wg.JobAssignment] = []
        self.acks: list[str] = []
        self.rejects: list[wg.Reject] = []
        self.welcome: wg.Welcome | None = None
        self.welcomed = asyncio.Event()
        self.ended = asyncio.Event()
        self.end_error: grpc.aio.AioRpcError | None = None
        self.deployment_id = ""  # the deployment it serves, once loaded (for tests that set it)
        self.drop_next_assignments = 0  # assignments "lost in transit"
        self.answer: JobAnswer = self.default_answer
        self.residents: dict[str, wg.ResidentModel] = {}  # what it reports it holds
        self._task: asyncio.Task[None] | None = None
        self._next_pid = 4242

    async def start(self, channel: grpc.aio.Channel, credential: str, *, wait: bool = True) -> None:
        stub = worker_gateway_pb2_grpc.WorkerGatewayStub(channel)
        hello = wg.Hello(
            hostname="scripted",
            environments=[ENVIRONMENT],
            inventory=self.inventory(),
        )
        self.send(wg.WorkerMessage(hello=hello))
        call = stub.Connect(self._messages(), metadata=auth_metadata(credential))
        self._task = asyncio.create_task(self._read(call))
        if wait:
            await asyncio.wait_for(self.welcomed.wait(), timeout=10)

    async def stop(self) -> None:
        self.outgoing.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task

    def send(self, message: wg.WorkerMessage) -> None:
        message.generation = self.generation
        self.outgoing.put_nowait(message)

    def inventory(self) -> wg.Inventory:
        return wg.Inventory(generation=self.generation, residents=list(self.residents.values()))

    def report_inventory(self) -> None:
        self.send(wg.WorkerMessage(inventory_report=wg.InventoryReport(inventory=self.inventory())))

    def heartbeat(self, active_job_ids: Iterable[str] = ()) -> None:
        self.send(wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=list(active_job_ids))))

    def default_answer(self, job: wg.JobAssignment) -> wg.JobResult | None:
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        spec = job.WhichOneof("spec")
        if spec == "load":
            pid = self._next_pid
            self._next_pid += 1
            result.load.CopyFrom(
                wg.LoadEvidence(
                    pid=pid,
                    dim=4,
                    load_seconds=0.1,
                    adapter_digest=adapter_digest(job.load.adapter),
                    environment_fingerprint=ENVIRONMENT_FINGERPRINT,
                )
            )
            self.residents[job.load.deployment_id] = wg.ResidentModel(
                deployment_id=job.load.deployment_id,
                artifact_digest=job.load.manifest_digest,
                adapter_digest=adapter_digest(job.load.adapter),
                environment_fingerprint=ENVIRONMENT_FINGERPRINT,
                environment_id="default",
                state=common_pb2.RESIDENCY_STATE_RESIDENT,
                pid=pid,
            )
        elif spec == "unload":
            resident = self.residents.pop(job.unload.deployment_id, None)
            result.unload.CopyFrom(
                wg.UnloadEvidence(pid=resident.pid if resident else 0, process_exited=True)
            )
        else:
            return None
        return result

    async def _messages(self) -> AsyncIterator[wg.WorkerMessage]:
        while (message := await self.outgoing.get()) is not None:
            yield message

    async def _read(self, call) -> None:  # type: ignore[no-untyped-def]
        try:
            async for message in call:
                self._handle(message)
        except grpc.aio.AioRpcError as error:
            self.end_error = error
        finally:
            self.ended.set()

    def _handle(self, message: wg.ControlMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self.welcome = message.welcome
            self.welcomed.set()
        elif kind == "job_assignment":
            self.assignments.append(message.job_assignment)
            if self.drop_next_assignments > 0:
                self.drop_next_assignments -= 1
                return
            result = self.answer(message.job_assignment)
            if result is not None:
                self.send(wg.WorkerMessage(job_result=result))
        elif kind == "invoke":
            self.invokes.put_nowait(message.invoke)
        elif kind == "cancel_invoke":
            self.cancels.put_nowait(message.cancel_invoke)
        elif kind == "ack":
            self.acks.append(message.ack.job_id)
        elif kind == "reject":
            self.rejects.append(message.reject)
