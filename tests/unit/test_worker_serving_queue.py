"""The child's serving loop never runs work that expired or was cancelled while queued."""

from __future__ import annotations

import io
import time
from pathlib import Path

from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from gantry.worker.model_host.framing import read_frame
from gantry.worker.model_host.inbox import Inbox, InboxItem, Queued, ResponseWriter
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.memory_readings import CudaAllocator
from gantry.worker.model_host.probe_evidence import LoadRecord
from gantry.worker.model_host.serving import ModelServer, ServingSettings


class _CountingEncoder:
    """Stands in for a SentenceTransformer, as the adapter's pass uses one: every text becomes a
    row of four ones."""

    device = "cpu"
    prompts: dict[str, str] = {}
    default_prompt_name = None
    truncate_dim = None

    def __init__(self) -> None:
        self.encoded: list[list[str]] = []

    def preprocess(self, inputs: list[str], prompt: str | None = None) -> dict[str, object]:
        return {"texts": list(inputs)}

    def __call__(self, features: dict[str, object]) -> dict[str, object]:
        import torch

        texts = features["texts"]
        assert isinstance(texts, list)
        self.encoded.append(texts)
        return {"sentence_embedding": torch.ones((len(texts), 4))}


def _server(
    encoder: _CountingEncoder, *, inbox: Inbox, stream: io.BytesIO, dim: int
) -> ModelServer:
    adapter = SentenceTransformersEmbedding()
    # What `load` would have set from a real model.
    adapter._model = encoder
    adapter._dim = dim
    cpu = CudaAllocator("cpu")
    unmeasured = common_pb2.Measurement(unavailable="device is cpu")
    return ModelServer(
        deployment_id="dep-test",
        adapter=adapter,
        record=LoadRecord(
            isolation=Isolation(level=IsolationLevel.NONE, reason="unit test"),
            model_directory=Path("/unit-test/model"),
            cuda=cpu,
            cuda_allocated_before_load=unmeasured,
            cuda_allocated_after_load=unmeasured,
            cuda_reserved_after_load=unmeasured,
            first_invoke_seconds=0.0,
        ),
        settings=ServingSettings(max_batch_inputs=8, test_hooks=False),
        inbox=inbox,
        responses=ResponseWriter(stream),
    )


def _embed(request_id: int, text: str, *, expires_at: float | None = None) -> Queued:
    request = model_host_pb2.HostRequest(
        request_id=request_id, embed=worker_gateway_pb2.EmbedPayload(inputs=[text])
    )
    return Queued(request, expires_at)


def _answers(stream: io.BytesIO) -> dict[int, model_host_pb2.HostResponse]:
    stream.seek(0)
    answers = {}
    while (payload := read_frame(stream)) is not None:
        response = model_host_pb2.HostResponse.FromString(payload)
        answers[response.request_id] = response
    return answers


def test_expired_and_cancelled_requests_are_not_run_and_the_rest_are() -> None:
    inbox = Inbox(limit=8)
    stream = io.BytesIO()
    encoder = _CountingEncoder()
    server = _server(encoder, inbox=inbox, stream=stream, dim=4)
    inbox.offer(_embed(1, "expired", expires_at=time.monotonic() - 1))
    inbox.offer(_embed(2, "cancelled"))
    inbox.cancel(2)
    inbox.offer(_embed(3, "wanted", expires_at=time.monotonic() + 60))
    inbox.offer(
        Queued(model_host_pb2.HostRequest(request_id=4, health=model_host_pb2.HealthCheck()), None)
    )
    inbox.offer(
        Queued(model_host_pb2.HostRequest(request_id=5, shutdown=model_host_pb2.Shutdown()), None)
    )
    assert server.serve() == 0

    answers = _answers(stream)
    assert answers[1].failure.reason == "DEADLINE_EXCEEDED"
    assert 2 not in answers  # its caller is gone: nobody to answer
    assert answers[3].embed.count == 1
    assert answers[4].health.model.status == worker_gateway_pb2.HEALTH_STATUS_OK
    # Shutdown releases the model and says what CUDA holds: nothing to read on a CPU device.
    assert answers[5].unloaded.cuda_allocated_after_unload.unavailable == "device is cpu"
    assert [text for batch in encoder.encoded for text in batch] == [
        "wanted",
        "Gantry model host health probe.",
    ]


def test_health_probe_of_the_wrong_width_fails_the_model_layer() -> None:
    server = _server(_CountingEncoder(), inbox=Inbox(limit=1), stream=io.BytesIO(), dim=32)
    layer = server.probe_model()
    assert layer.status == worker_gateway_pb2.HEALTH_STATUS_FAILED
    assert "width 4 != loaded dimension 32" in layer.detail


class _RecordingInbox(Inbox):
    """An Inbox that remembers how long each `get` was allowed to wait."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self.waits: list[float | None] = []

    def get(self, timeout: float | None = None) -> InboxItem:
        self.waits.append(timeout)
        return super().get(timeout=timeout)


def _shutdown(request_id: int) -> Queued:
    return Queued(
        model_host_pb2.HostRequest(request_id=request_id, shutdown=model_host_pb2.Shutdown()), None
    )


def test_embeds_queued_while_the_host_was_busy_run_as_batches_up_to_the_bound() -> None:
    inbox = Inbox(limit=16)
    stream = io.BytesIO()
    encoder = _CountingEncoder()
    server = _server(encoder, inbox=inbox, stream=stream, dim=4)  # max_batch_inputs=8
    for request_id in range(1, 12):
        inbox.offer(_embed(request_id, f"text {request_id}"))
    inbox.offer(_shutdown(99))
    assert server.serve() == 0

    assert [len(batch) for batch in encoder.encoded] == [8, 3]
    answers = _answers(stream)
    assert all(answers[request_id].embed.count == 1 for request_id in range(1, 12))


def test_a_lone_embed_runs_at_once_without_waiting_for_company() -> None:
    inbox = _RecordingInbox(limit=4)
    stream = io.BytesIO()
    encoder = _CountingEncoder()
    server = _server(encoder, inbox=inbox, stream=stream, dim=4)
    inbox.offer(_embed(1, "alone"))
    inbox.offer(_shutdown(2))
    assert server.serve() == 0

    assert encoder.encoded == [["alone"]]
    # The first get blocks for work; gathering a batch never waits (timeout 0 = take what is
    # queued): the shutdown behind it ends that batch and is served next.
    assert inbox.waits[0] is None
    assert inbox.waits[1] == 0
    assert _answers(stream)[1].embed.count == 1
