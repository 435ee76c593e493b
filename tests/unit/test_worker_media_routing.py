"""The worker hands each Invoke payload to its model host's `invoke` under that payload's kind (the
operation registry's) and puts the answer in the matching outcome (an image embedding answers as
`embed`); an Invoke with no payload is refused by name."""

from __future__ import annotations

import asyncio

import pytest

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.invocations import Invocations

IMAGE = common_pb2.Image(data=b"\x89PNG", media_type="image/png")


class FakeMediaHost:
    """Answers each kind with a fixed result and records (kind, payload)."""

    RESULTS = {
        "transcribe": wg.TranscribeResult(text="hello", audio_seconds=1.0),
        "recognize_text": wg.RecognizeTextResult(texts=["line"]),
        "embed_image": wg.EmbedResult(count=1, dim=1, float32_le=b"\x00\x00\x80\x3f"),
        "classify_image": wg.ClassifyImageResult(count=1, labels=1, scores=[0.5]),
    }

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    async def invoke(  # type: ignore[no-untyped-def]
        self, kind: str, payload: object, *, trace_context: object, timeout_s: float, on_delta=None
    ):
        self.calls.append((kind, payload))
        return self.RESULTS[kind]


class FakeSupervisor:
    def __init__(self, host: FakeMediaHost) -> None:
        self.host = host

    def host_for_invoke(self, deployment_id: str) -> FakeMediaHost:
        return self.host


async def _answer(invoke: wg.Invoke, host: FakeMediaHost) -> wg.InvokeResult:
    answered: asyncio.Queue[wg.InvokeResult] = asyncio.Queue()
    invocations = Invocations(
        supervisor=FakeSupervisor(host),  # type: ignore[arg-type]
        emit=answered.put_nowait,
    )
    invocations.start(invoke, {})
    return await asyncio.wait_for(answered.get(), timeout=5)


@pytest.mark.parametrize(
    ("field", "payload", "method", "outcome"),
    [
        (
            "transcribe",
            wg.TranscribePayload(audio=common_pb2.Audio(data=b"RIFF", media_type="audio/wav")),
            "transcribe",
            "transcribe",
        ),
        (
            "recognize_text",
            wg.RecognizeTextPayload(images=[IMAGE]),
            "recognize_text",
            "recognize_text",
        ),
        ("embed_image", wg.EmbedImagePayload(images=[IMAGE]), "embed_image", "embed"),
        (
            "classify_image",
            wg.ClassifyImagePayload(images=[IMAGE], labels=["cat"]),
            "classify_image",
            "classify_image",
        ),
    ],
)
async def test_each_media_payload_reaches_its_host_method_and_answers_in_its_outcome(
    field: str, payload: object, method: str, outcome: str
) -> None:
    host = FakeMediaHost()
    invoke = wg.Invoke(request_id="r1", deployment_id="d1")
    getattr(invoke, field).CopyFrom(payload)
    invoke.timeout.FromSeconds(5)
    result = await _answer(invoke, host)
    assert result.WhichOneof("outcome") == outcome, result
    assert host.calls == [(method, payload)]


async def test_an_invoke_without_a_payload_is_refused_by_name() -> None:
    invoke = wg.Invoke(request_id="r2", deployment_id="d1")
    invoke.timeout.FromSeconds(5)
    result = await _answer(invoke, FakeMediaHost())
    assert result.failure.reason == "INVALID_PAYLOAD"
    assert "none" in result.failure.message
