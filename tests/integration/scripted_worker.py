"""A scripted worker: a real gRPC client of WorkerGateway.Connect whose answers a test decides.

It stands in for a worker agent where a test needs control over what the control plane hears
(a lost assignment, a failed unload, an inventory of its choosing, an inspection's findings, a
probe's stages and evidence) without real model hosts. It is a named fake of the worker
protocol: what it sends is what a worker may send, nothing the control plane could not receive.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gantry.common.auth import auth_metadata
from gantry.common.digests import adapter_digest, environment_fingerprint
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.v1 import common_pb2, control_plane_pb2, worker_gateway_pb2_grpc
from gantry.v1 import worker_gateway_pb2 as wg

if TYPE_CHECKING:
    from tests.integration.harness import Harness

ENVIRONMENT = wg.RuntimeEnvironment(
    environment_id="default", python_executable="/scripted", adapters=["sentence_transformers"]
)
ENVIRONMENT_FINGERPRINT = environment_fingerprint(ENVIRONMENT)

# A scripted worker heartbeats only when its test says so. At the default 3 s interval its node is
# stale 9 s after it connects, which a test of several steps reaches on a busy machine (a flood
# test once met DEPLOYMENT_NOT_READY): tests that keep one serving use this reconciler.
SILENT_WORKER = ReconcilerSettings(interval_s=0.2, heartbeat_interval_s=60.0)


def host_ram(capacity_bytes: int, margin_bytes: int = 0) -> common_pb2.ResourceDomain:
    """A `host.ram` domain, as a worker's Hello declares it."""
    return common_pb2.ResourceDomain(
        name="host.ram",
        kind=common_pb2.RESOURCE_KIND_RAM,
        capacity_bytes=capacity_bytes,
        safety_margin_bytes=margin_bytes,
    )


# Room for every deployment the tests make, so that placement never refuses for capacity
# unless a test declares less.
GENEROUS_DOMAINS = (host_ram(64 << 30),)

JobAnswer = Callable[[wg.JobAssignment], wg.JobResult | None]

# The stages a worker reports while it probes, in order (the result then completes the probe).
PROBE_STAGES = (
    common_pb2.PROBE_STATE_PREPARING,
    common_pb2.PROBE_STATE_LOADING,
    common_pb2.PROBE_STATE_HEALTHCHECKING,
    common_pb2.PROBE_STATE_READY,
    common_pb2.PROBE_STATE_UNLOADING,
)


def compatible_inspection() -> wg.Inspection:
    """A SentenceTransformers embedding model with safetensors weights, as an inspector reads it."""
    return wg.Inspection(
        inspector="sentence_transformers",
        model_type="bert",
        modalities=["text"],
        task="embedding",
        weight_format="safetensors",
        adapters=["sentence_transformers"],
        executable=True,
        details={"hidden_size": "4"},
    )


def healthy_probe_evidence(probe: wg.ProbeSpec) -> wg.ProbeEvidence:
    """Evidence a healthy probe returns: every check passes; CUDA is absent and says so."""
    ok = wg.HealthLayer(status=wg.HEALTH_STATUS_OK)
    return wg.ProbeEvidence(
        runtime_versions={"python": "3.11", "torch": "scripted", "cuda_available": "false"},
        environment_id=probe.environment_id or "default",
        environment_fingerprint=ENVIRONMENT_FINGERPRINT,
        offline=wg.OfflineEvidence(
            local_files_only=True,
            trust_remote_code=False,
            offline_env={"HF_HUB_OFFLINE": "1"},
            network_guard=True,
        ),
        load_seconds=0.5,
        first_invoke_seconds=0.05,
        output_shape=[1, 4],
        output_finite=True,
        health=wg.HealthReport(
            process=ok,
            runtime=ok,
            model=ok,
            capability=wg.HealthLayer(status=wg.HEALTH_STATUS_NOT_CHECKED, detail="NOT_ROUTED"),
        ),
        memory=wg.MemoryEvidence(
            rss_current=common_pb2.Measurement(bytes=200_000_000, source="/proc/pid/status VmRSS"),
            rss_peak=common_pb2.Measurement(bytes=300_000_000, source="/proc/pid/status VmHWM"),
            cuda_peak_allocated=common_pb2.Measurement(unavailable="CUDA is not available"),
        ),
        reclaim=wg.ReclaimEvidence(
            pid=5150, process_exited=True, reaped=True, has_exit_code=True, reclaimed=True
        ),
        adapter=probe.adapter.adapter,
        adapter_digest=adapter_digest(probe.adapter),
    )


def honest_load_evidence(spec: wg.LoadSpec) -> dict[str, Any]:
    """The LoadEvidence fields the control plane checks against the job, as a real worker sets
    them after verifying every file of the manifest (none for an adopted endpoint)."""
    if spec.HasField("endpoint"):
        return {"isolation": "NONE"}
    return {
        "manifest_digest": spec.manifest_digest,
        "files_verified": len(spec.manifest),
        "bytes_verified": sum(entry.size_bytes for entry in spec.manifest),
        "isolation": "NONE",
    }


class ScriptedWorker:
    """Answers loads and unloads by default, holds invocations; every message is recorded."""

    def __init__(
        self,
        *,
        generation: int = 1,  # what its Hello presents; the Welcome's is stamped after it
        resource_domains: Sequence[common_pb2.ResourceDomain] = GENEROUS_DOMAINS,
    ) -> None:
        self.generation = generation
        self.resource_domains = list(resource_domains)  # what its Hello offers placement
        self.gpus: list[common_pb2.GpuDevice] = []  # its GPUs as NVML would name them
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
        self.cancelled_jobs: list[str] = []  # CancelJob messages received
        # The evidence pipeline: what an INSPECT job finds (or its failure), and what a PROBE job
        # reports (its stages, then its evidence or its failure). `hold_pipeline_jobs` keeps
        # INSPECT and PROBE assignments unanswered for the test to answer step by step.
        self.inspection = compatible_inspection()
        self.inspect_failure: common_pb2.Failure | None = None
        self.probe_evidence: Callable[[wg.ProbeSpec], wg.ProbeEvidence] = healthy_probe_evidence
        self.probe_failure: common_pb2.Failure | None = None
        self.hold_pipeline_jobs = False
        # Answer every Embed invocation at once (vectors of `embed_dim` floats, each 1.0) instead
        # of queueing it for the test.
        self.answer_invokes = False
        self.embed_dim = 4
        # The value every component of a text's vector takes (1.0 unless a test tells texts apart).
        self.embed_value: Callable[[str], float] = lambda text: 1.0
        self.answered_invokes: list[wg.Invoke] = []
        # Whether its Hello says it reads ControlMessage.batch; the size of each batch it got.
        self.reads_batches = False
        self.batches: list[int] = []
        self._task: asyncio.Task[None] | None = None
        self._next_pid = 4242

    async def start(self, channel: grpc.aio.Channel, credential: str, *, wait: bool = True) -> None:
        stub = worker_gateway_pb2_grpc.WorkerGatewayStub(channel)
        hello = wg.Hello(
            hostname="scripted",
            environments=[ENVIRONMENT],
            inventory=self.inventory(),
            resource_domains=self.resource_domains,
            gpus=self.gpus,
            control_batches_understood=self.reads_batches,
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

    def answer_embed(self, invoke: wg.Invoke) -> None:
        """Answer an Embed invocation: a vector of width 1 holding 1.0 for each input."""
        count = len(invoke.embed.inputs)
        self.send(
            wg.WorkerMessage(
                invoke_result=wg.InvokeResult(
                    request_id=invoke.request_id,
                    embed=wg.EmbedResult(
                        count=count, dim=1, float32_le=struct.pack("<f", 1.0) * count
                    ),
                )
            )
        )

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
                    # What an honest worker verified: the set the job names, all of it.
                    **honest_load_evidence(job.load),
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
        elif spec in ("inspect", "probe"):
            if self.hold_pipeline_jobs:
                return None
            if spec == "probe":
                for stage in PROBE_STAGES:
                    self.report_stage(job, stage)
            return self.pipeline_result(job)
        else:
            return None
        return result

    def pipeline_result(self, job: wg.JobAssignment) -> wg.JobResult:
        """The scripted result of an INSPECT or PROBE assignment (a failure, if one is set)."""
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        if job.WhichOneof("spec") == "inspect":
            if self.inspect_failure is not None:
                result.failure.CopyFrom(self.inspect_failure)
            else:
                result.inspect.CopyFrom(
                    wg.InspectEvidence(
                        inspection=self.inspection,
                        environment_id=job.inspect.environment_id or "default",
                        environment_fingerprint=ENVIRONMENT_FINGERPRINT,
                        files_verified=len(job.inspect.artifact.manifest),
                    )
                )
        elif self.probe_failure is not None:
            result.failure.CopyFrom(self.probe_failure)
        else:
            result.probe.CopyFrom(self.probe_evidence(job.probe))
        return result

    def report_stage(self, job: wg.JobAssignment, stage: int) -> None:
        """A JobUpdate naming the probe stage just entered, under the job's lease."""
        self.send(
            wg.WorkerMessage(
                job_update=wg.JobUpdate(
                    job_id=job.job_id,
                    lease_token=job.lease_token,
                    state=wg.JOB_STATE_RUNNING,
                    probe_state=stage,  # type: ignore[arg-type]
                )
            )
        )

    def finish(self, job: wg.JobAssignment) -> None:
        """Send the scripted result of a held INSPECT or PROBE assignment."""
        self.send(wg.WorkerMessage(job_result=self.pipeline_result(job)))

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
        if kind == "batch":
            self.batches.append(len(message.batch.messages))
            for inner in message.batch.messages:
                self._handle(inner)
        elif kind == "welcome":
            self.welcome = message.welcome
            # The generation the control plane issued, stamped from here on (as a worker does).
            self.generation = message.welcome.accepted_generation
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
            if self.answer_invokes and message.invoke.WhichOneof("payload") == "embed":
                self.answered_invokes.append(message.invoke)
                count = len(message.invoke.embed.inputs)
                self.send(
                    wg.WorkerMessage(
                        invoke_result=wg.InvokeResult(
                            request_id=message.invoke.request_id,
                            embed=wg.EmbedResult(
                                count=count,
                                dim=self.embed_dim,
                                float32_le=b"".join(
                                    struct.pack("<f", self.embed_value(text)) * self.embed_dim
                                    for text in message.invoke.embed.inputs
                                ),
                            ),
                        )
                    )
                )
            else:
                self.invokes.put_nowait(message.invoke)
        elif kind == "cancel_job":
            self.cancelled_jobs.append(message.cancel_job.job_id)
        elif kind == "cancel_invoke":
            self.cancels.put_nowait(message.cancel_invoke)
        elif kind == "ack":
            self.acks.append(message.ack.job_id)
        elif kind == "reject":
            self.rejects.append(message.reject)


@contextlib.asynccontextmanager
async def serving_tiny(
    harness: Harness, model_dir: Path, *, max_concurrency: int
) -> AsyncIterator[ScriptedWorker]:
    """A scripted worker on node "scripted" with the model at `model_dir` READY on it as "tiny",
    `max_concurrency` calls at once; the test answers each invocation."""
    worker = ScriptedWorker()
    await worker.start(harness.channel, await harness.register_node("scripted"))
    try:
        artifact = await harness.register_model(model_dir, "tiny")
        deployment = await harness.deploy(
            artifact.artifact_set_id, "tiny", max_concurrency=max_concurrency
        )
        await harness.wait_deployment(
            deployment.deployment_id, control_plane_pb2.DEPLOYMENT_STATE_READY, timeout=20
        )
        yield worker
    finally:
        await worker.stop()
