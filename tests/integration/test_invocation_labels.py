"""Invocation metrics per model: the control plane counts each Inference call under the deployment
it resolved to and that deployment's capability (never a name the client typed: a call refused
before resolution is UNRESOLVED), sends the capability to the worker, and the worker labels its
own count with it; past the caps further models count as OTHER.

The instruments are the OpenTelemetry SDK's, from a provider of this test's own with an in-memory
reader (the process-wide provider is set once per process and other tests share it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gantry.common import operations
from gantry.common.auth import auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.common.metrics import (
    CAPABILITY_LABELS,
    DEPLOYMENT_LABELS,
    OTHER,
    UNRESOLVED,
    ModelLabels,
    duration_histogram,
)
from gantry.controlplane.platform import metrics as controlplane_metrics
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import ResolvedTarget
from gantry.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import metrics as worker_metrics
from gantry.worker.invocations import Invocations
from tests.integration.inference_server_support import serving

INVOCATIONS = "gantry_invocations"
STAGES = "gantry_invocation_stage_duration_seconds"
WORKER_INVOCATIONS = "gantry_worker_invocations"
WORKER_DURATION = "gantry_worker_invocation_duration_seconds"
# The deployments that exist, and their capabilities, as the resolver reads them.
DEPLOYMENTS = {"dep-minilm": "minilm", "dep-bge": "bge"}


class Recorded:
    """What the swapped-in instruments recorded: metric name -> its data points."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._reader = reader

    def points(self, name: str) -> list[Any]:
        data = self._reader.get_metrics_data()
        return [
            point
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]

    def total(self, name: str, **labels: str) -> float:
        """Counter sum, or histogram count, over the points whose labels include `labels`."""
        return sum(
            getattr(point, "value", None) or getattr(point, "count", 0)
            for point in self.points(name)
            if labels.items() <= dict(point.attributes).items()
        )

    def values(self, name: str, label: str) -> set[str]:
        return {str(point.attributes[label]) for point in self.points(name)}


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorded]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("test")
    monkeypatch.setattr(controlplane_metrics, "_invocations", meter.create_counter(INVOCATIONS))
    monkeypatch.setattr(
        controlplane_metrics, "_stage_duration", duration_histogram(meter, STAGES, "")
    )
    monkeypatch.setattr(worker_metrics, "_invocations", meter.create_counter(WORKER_INVOCATIONS))
    monkeypatch.setattr(
        worker_metrics, "_invocation_duration", duration_histogram(meter, WORKER_DURATION, "")
    )
    # Caps of this test's own: what other tests of the process labelled takes no slot here.
    monkeypatch.setattr(controlplane_metrics, "_models", ModelLabels())
    monkeypatch.setattr(worker_metrics, "_models", ModelLabels())
    yield Recorded(reader)
    provider.shutdown()


class FakeResolver:
    """Resolves only the deployments in DEPLOYMENTS (by id, or by their capability)."""

    async def resolve_target(self, request: inference_pb2.EmbedRequest) -> ResolvedTarget:
        if request.WhichOneof("target") == "deployment_id":
            if request.deployment_id in DEPLOYMENTS:
                return ResolvedTarget(request.deployment_id, DEPLOYMENTS[request.deployment_id])
        for deployment_id, capability in DEPLOYMENTS.items():
            if request.capability == capability:
                return ResolvedTarget(deployment_id, capability)
        raise GantryError("NOT_FOUND", "no deployment is bound to that capability")


class FakeSchedulerLink:
    async def dispatch(
        self, work: scheduler_pb2.WorkSubmitted, *, timeout: float
    ) -> scheduler_pb2.Dispatch:
        return scheduler_pb2.Dispatch(work_id=work.work_id, node_id="n1", residency_id="r1")

    def work_finished(self, work_id: str, outcome: int, *, reason: str = "") -> None:
        pass


@dataclass
class FakeHub:
    """Answers every embed with one vector; records the capability each Invoke would carry."""

    capabilities: list[str] = field(default_factory=list)

    async def invoke(self, *, capability: str = "", **_: object) -> wg.InvokeResult:
        self.capabilities.append(capability)
        return wg.InvokeResult(embed=wg.EmbedResult(count=1, dim=1, float32_le=b"\x00\x00\x80?"))


@dataclass
class Served:
    stub: inference_pb2_grpc.InferenceStub
    hub: FakeHub
    md: tuple[tuple[str, str], ...] = auth_metadata("client-key")

    async def embed(self, **target: str) -> grpc.StatusCode:
        try:
            await self.stub.Embed(
                inference_pb2.EmbedRequest(inputs=["x"], **target), metadata=self.md, timeout=10
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    hub = FakeHub()
    service = InferenceService(
        database=None,  # type: ignore[arg-type]  # the fake resolver reads nothing stored
        hub=hub,  # type: ignore[arg-type]
        scheduler=FakeSchedulerLink(),  # type: ignore[arg-type]
        routes=RouteCache(ManualClock()),
        clock=ManualClock(),
        resolver=FakeResolver(),  # type: ignore[arg-type]
    )
    async with serving(service) as stub:
        yield Served(stub=stub, hub=hub)


async def test_calls_are_counted_under_the_resolved_deployment_and_its_capability(
    served: Served, recorded: Recorded
) -> None:
    assert await served.embed(capability="minilm") == grpc.StatusCode.OK
    assert await served.embed(deployment_id="dep-minilm") == grpc.StatusCode.OK
    assert await served.embed(capability="bge") == grpc.StatusCode.OK

    minilm = {"capability": "minilm", "deployment": "dep-minilm"}
    bge = {"capability": "bge", "deployment": "dep-bge"}
    assert recorded.total(INVOCATIONS, operation="Embed", code="OK", **minilm) == 2
    assert recorded.total(INVOCATIONS, operation="Embed", code="OK", **bge) == 1
    for stage in ("resolve", "schedule", "worker", "total"):
        assert recorded.total(STAGES, operation="Embed", stage=stage, **minilm) == 2, stage
        assert recorded.total(STAGES, operation="Embed", stage=stage, **bge) == 1, stage
    # The worker is told the capability, whichever way the client named the deployment.
    assert served.hub.capabilities == ["minilm", "minilm", "bge"]


async def test_a_call_refused_before_resolution_mints_no_series_of_its_own(
    served: Served, recorded: Recorded
) -> None:
    for index in range(20):
        assert await served.embed(capability=f"typo-{index}") == grpc.StatusCode.NOT_FOUND
    assert await served.embed(deployment_id="dep-gone") == grpc.StatusCode.NOT_FOUND
    unresolved = {"capability": UNRESOLVED, "deployment": UNRESOLVED}
    assert recorded.total(INVOCATIONS, reason="NOT_FOUND", **unresolved) == 21
    assert recorded.values(INVOCATIONS, "capability") == {UNRESOLVED}
    assert recorded.values(INVOCATIONS, "deployment") == {UNRESOLVED}
    # Only the whole call's latency: no stage ran for a model.
    assert recorded.values(STAGES, "stage") == {"total"}
    assert served.hub.capabilities == []


def test_past_the_caps_further_models_count_as_other(recorded: Recorded) -> None:
    calls = 3 * DEPLOYMENT_LABELS
    for index in range(calls):
        with controlplane_metrics.counting():
            controlplane_metrics.call_resolved(f"cap-{index}", f"dep-{index}")
            controlplane_metrics.invocation_answered(operations.EMBED.rpc, None, 0.01)
        worker_metrics.invocation_answered(
            "", 0.01, capability=f"cap-{index}", deployment_id=f"dep-{index}"
        )
    for name in (INVOCATIONS, STAGES, WORKER_INVOCATIONS, WORKER_DURATION):
        capabilities = recorded.values(name, "capability")
        deployments = recorded.values(name, "deployment")
        assert len(capabilities) == CAPABILITY_LABELS + 1 and OTHER in capabilities, name
        assert len(deployments) == DEPLOYMENT_LABELS + 1 and OTHER in deployments, name
        # The first ones keep their names; every call is still counted.
        assert "cap-0" in capabilities and "dep-0" in deployments, name
        assert recorded.total(name) == calls, name
    assert recorded.total(INVOCATIONS, deployment=OTHER) == calls - DEPLOYMENT_LABELS


def test_model_labels_fold_each_label_on_its_own_cap_and_name_the_unresolved() -> None:
    labels = ModelLabels(capabilities=1, deployments=2)
    assert labels("minilm", "d1") == ("minilm", "d1")
    assert labels("bge", "d2") == (OTHER, "d2")
    assert labels("minilm", "d3") == ("minilm", OTHER)
    assert labels("", "") == (UNRESOLVED, UNRESOLVED)
    assert labels("minilm", "d1") == ("minilm", "d1")  # kept for good


class FakeHost:
    async def invoke(self, kind: str, payload: object, **_: object) -> wg.EmbedResult:
        return wg.EmbedResult(count=1, dim=1, float32_le=b"\x00\x00\x80?")


class FakeSupervisor:
    def host_for_invoke(self, deployment_id: str) -> FakeHost:
        if deployment_id != "dep-minilm":
            raise GantryError("DEPLOYMENT_NOT_READY", f"{deployment_id} is not resident")
        return FakeHost()


async def test_the_worker_labels_its_invocations_with_the_model_it_was_sent(
    recorded: Recorded,
) -> None:
    answered: asyncio.Queue[wg.InvokeResult] = asyncio.Queue()
    invocations = Invocations(
        supervisor=FakeSupervisor(),  # type: ignore[arg-type]
        emit=answered.put_nowait,
    )
    sent = [
        wg.Invoke(request_id="r1", deployment_id="dep-minilm", capability="minilm"),
        wg.Invoke(request_id="r2", deployment_id="dep-bge", capability="bge"),
        wg.Invoke(request_id="r3", deployment_id="dep-minilm"),  # from an older control plane
    ]
    for invoke in sent:
        invoke.embed.inputs.append("x")
        invoke.timeout.FromSeconds(5)
        invocations.start(invoke, {})
    results = [await asyncio.wait_for(answered.get(), timeout=5) for _ in sent]
    assert sorted(result.failure.reason for result in results) == ["", "", "DEPLOYMENT_NOT_READY"]

    ok = {"outcome": "OK", "deployment": "dep-minilm"}
    assert recorded.total(WORKER_INVOCATIONS, capability="minilm", **ok) == 1
    assert recorded.total(WORKER_INVOCATIONS, capability=UNRESOLVED, **ok) == 1
    bge = {"capability": "bge", "deployment": "dep-bge"}
    assert recorded.total(WORKER_INVOCATIONS, reason="DEPLOYMENT_NOT_READY", **bge) == 1
    assert recorded.total(WORKER_DURATION, capability="minilm", deployment="dep-minilm") == 1
    assert recorded.total(WORKER_DURATION) == 3
