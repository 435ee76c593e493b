"""The child's serving loop never runs work that expired or was cancelled while queued."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters.sentence_transformers_embedding import (
    SentenceTransformersEmbedding,
)
from gantry.worker.model_host.framing import read_frame
from gantry.worker.model_host.inbox import Inbox, InboxItem, Queued, ResponseWriter, Woken
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.memory_readings import CudaAllocator
from gantry.worker.model_host.pass_lanes import PassLanes
from gantry.worker.model_host.probe_evidence import LoadRecord
from gantry.worker.model_host.serving import ModelServer, ServingSettings
from tests.waiting import poll_sync


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
    encoder: _CountingEncoder,
    *,
    inbox: Inbox,
    stream: io.BytesIO,
    dim: int,
    lanes: PassLanes | None = None,
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
        lanes=lanes,
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


class _WritesCounted(io.BytesIO):
    """The host's pipe, counting its writes: each is one system call on a real socket."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: object) -> int:
        self.writes += 1
        return super().write(data)  # type: ignore[arg-type]


def test_a_pass_answers_all_its_callers_in_one_write() -> None:
    inbox = Inbox(limit=16)
    stream = _WritesCounted()
    server = _server(_CountingEncoder(), inbox=inbox, stream=stream, dim=4)  # max_batch_inputs=8
    for request_id in range(1, 12):
        inbox.offer(_embed(request_id, f"text {request_id}"))
    inbox.offer(_shutdown(99))
    assert server.serve() == 0

    # Two passes (8 callers, then 3) and the shutdown's answer: three writes, not twelve.
    assert stream.writes == 3
    answers = _answers(stream)
    assert sorted(answers) == [*range(1, 12), 99]


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


class _ThreadRecordingEncoder(_CountingEncoder):
    """Also remembers which thread ran each pass."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def __call__(self, features: dict[str, object]) -> dict[str, object]:
        self.threads.append(threading.current_thread().name)
        return super().__call__(features)


def _served_with_lanes(*items: Queued) -> tuple[_ThreadRecordingEncoder, io.BytesIO]:
    """Queue `items` and a shutdown, serve them all on a host with two lanes (max_batch_inputs
    8); the encoder that ran the passes and the answers' stream."""
    inbox = Inbox(limit=16)
    stream = io.BytesIO()
    encoder = _ThreadRecordingEncoder()
    lanes = PassLanes(threads=2, set_threads=lambda _: None)
    server = _server(encoder, inbox=inbox, stream=stream, dim=4, lanes=lanes)
    for item in (*items, _shutdown(99)):
        inbox.offer(item)
    assert server.serve() == 0
    return encoder, stream


def _order(stream: io.BytesIO) -> list[int]:
    stream.seek(0)
    order = []
    while (payload := read_frame(stream)) is not None:
        order.append(model_host_pb2.HostResponse.FromString(payload).request_id)
    return order


def test_with_lanes_batches_of_several_callers_run_on_them_at_half_the_bound() -> None:
    encoder, stream = _served_with_lanes(*(_embed(i, f"text {i}") for i in range(1, 12)))

    # Two lanes of 4 inputs each hold no more than the bound of 8 that one pass would.
    assert sorted(len(batch) for batch in encoder.encoded) == [3, 4, 4]
    assert all(name.startswith("pass-lane") for name in encoder.threads)
    answers = _answers(stream)
    assert all(answers[request_id].embed.count == 1 for request_id in range(1, 12))
    # The unload runs alone: after every batch on a lane was answered.
    assert _order(stream)[-1] == 99


def test_with_lanes_a_lone_call_on_an_idle_host_runs_on_the_serving_loop_s_thread() -> None:
    encoder, stream = _served_with_lanes(_embed(1, "alone"))

    assert encoder.encoded == [["alone"]]
    assert encoder.threads == [threading.current_thread().name]
    assert _order(stream) == [1, 99]


def test_with_lanes_a_health_check_runs_alone_after_the_batches_before_it() -> None:
    health = model_host_pb2.HostRequest(request_id=50, health=model_host_pb2.HealthCheck())
    encoder, stream = _served_with_lanes(
        *(_embed(i, f"text {i}") for i in range(1, 7)),
        Queued(health, None),
        _embed(7, "after the check"),
    )

    order = _order(stream)
    # Every embed queued before the check was answered before it; the one after, after it.
    assert set(order[: order.index(50)]) == {1, 2, 3, 4, 5, 6}
    assert order[order.index(50) + 1 :] == [7, 99]
    assert encoder.encoded[-2] == ["Gantry model host health probe."]
    assert encoder.threads[-2] == threading.current_thread().name


class _GatedEncoder(_ThreadRecordingEncoder):
    """Its first pass holds until `gate` is set, the way a long pass holds its lane."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.holding = threading.Event()
        self._first = True

    def __call__(self, features: dict[str, object]) -> dict[str, object]:
        first, self._first = self._first, False
        if first:
            self.holding.set()
            assert self.gate.wait(timeout=60), "the test never let the first pass end"
        return super().__call__(features)


class _WatchedInbox(Inbox):
    """Says when the serving loop waits for company beside a running pass."""

    def __init__(self) -> None:
        super().__init__(limit=16)
        self.waiting = threading.Event()

    def get_or_woken(self) -> InboxItem | Woken:
        self.waiting.set()
        return super().get_or_woken()


def _serving_beside_a_held_pass() -> tuple[
    _GatedEncoder, _WatchedInbox, io.BytesIO, threading.Thread
]:
    """A host with two lanes (max_batch_inputs 8: lanes of 4, a batch beside a pass needs 2)
    serving in a thread: embeds 1 and 2 went to a lane whose pass holds, and embed 3, alone in
    the inbox, waits for company."""
    inbox, stream, encoder = _WatchedInbox(), io.BytesIO(), _GatedEncoder()
    lanes = PassLanes(threads=2, set_threads=lambda _: None)
    server = _server(encoder, inbox=inbox, stream=stream, dim=4, lanes=lanes)
    inbox.offer(_embed(1, "one"))
    inbox.offer(_embed(2, "two"))
    serving = threading.Thread(target=server.serve, name="serving-loop")
    serving.start()
    assert encoder.holding.wait(timeout=60), "the batch [1, 2] never started"
    inbox.offer(_embed(3, "three"))
    if not inbox.waiting.wait(timeout=60):
        encoder.gate.set()
        raise AssertionError("embed 3 did not wait for company beside the running pass")
    return encoder, inbox, stream, serving


def test_with_lanes_a_short_batch_beside_a_running_pass_waits_for_company() -> None:
    encoder, inbox, stream, serving = _serving_beside_a_held_pass()
    inbox.offer(_embed(4, "four"))
    poll_sync(lambda: len(encoder.encoded) == 1, timeout_s=60, what="the batch [3, 4] to run")
    encoder.gate.set()
    inbox.offer(_shutdown(99))
    serving.join(timeout=60)

    # 3 waited for 4 instead of running alone beside [1, 2]: two passes of two, not three.
    assert sorted(encoder.encoded) == [["one", "two"], ["three", "four"]]
    assert _order(stream)[-1] == 99


def test_with_lanes_a_short_batch_starts_when_the_pass_beside_it_ends() -> None:
    encoder, inbox, stream, serving = _serving_beside_a_held_pass()
    encoder.gate.set()  # the pass ends, and nobody else came
    poll_sync(lambda: len(encoder.encoded) == 2, timeout_s=60, what="embed 3 to run")
    inbox.offer(_shutdown(99))
    serving.join(timeout=60)

    assert encoder.encoded == [["one", "two"], ["three"]]
    # Alone on an idle host again: on the serving loop's thread with all its threads.
    assert encoder.threads == ["pass-lane_0", "serving-loop"]
    assert _order(stream) == [1, 2, 3, 99]
