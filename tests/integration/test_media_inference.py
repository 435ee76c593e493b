"""The media RPCs through a real in-process gRPC server (interceptor, error mapping, registered
methods), with the scheduler link, the worker hub and the resolver as named fakes: what each
handler sends (the payload with the control plane's limits, the cost its headers say) and how it
answers (the response it builds, the typed refusals it gives before anything is scheduled), and
how a worker answer the control plane refuses is reported to the scheduler (Embed and
Rerank too)."""

from __future__ import annotations

import io
import math
import struct
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest
from PIL import Image

from gantry.common.auth import auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.inference_limits import InferenceLimits
from gantry.common.status import error_info_of
from gantry.controlplane.serving.inference_service import InferenceService, InferenceSettings
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import ResolvedTarget
from gantry.controlplane.serving.work_cost import audio_cost, classify_cost, image_cost
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.inference_server_support import serving

LIMITS = InferenceLimits(max_image_pixels=1_000_000, max_audio_seconds=10, max_images=4)


class FakeResolver:
    async def resolve_target(self, request: object) -> ResolvedTarget:
        return ResolvedTarget("dep-1", "media")


class FakeSchedulerLink:
    """Dispatches everything to n1 and records what was submitted and how it finished."""

    def __init__(self) -> None:
        self.submitted: list[scheduler_pb2.WorkSubmitted] = []
        self.finished: list[tuple[int, str]] = []

    async def dispatch(
        self, work: scheduler_pb2.WorkSubmitted, *, timeout: float
    ) -> scheduler_pb2.Dispatch:
        self.submitted.append(work)
        return scheduler_pb2.Dispatch(work_id=work.work_id, node_id="n1", residency_id="r1")

    def work_finished(self, work_id: str, outcome: int, *, reason: str = "") -> None:
        self.finished.append((outcome, reason))


@dataclass
class FakeHub:
    """Answers each invoke with the next scripted result; records the payloads."""

    answers: list[wg.InvokeResult] = field(default_factory=list)
    payloads: list[object] = field(default_factory=list)

    async def invoke(self, *, payload: object, **_: object) -> wg.InvokeResult:
        self.payloads.append(payload)
        return self.answers.pop(0)


@dataclass
class Served:
    stub: inference_pb2_grpc.InferenceStub
    hub: FakeHub
    link: FakeSchedulerLink
    md: tuple[tuple[str, str], ...] = auth_metadata("client-key")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    hub, link = FakeHub(), FakeSchedulerLink()
    service = InferenceService(
        database=None,  # type: ignore[arg-type]  # the fake resolver reads nothing stored
        hub=hub,  # type: ignore[arg-type]
        scheduler=link,  # type: ignore[arg-type]
        routes=RouteCache(ManualClock()),
        clock=ManualClock(),
        settings=InferenceSettings(limits=LIMITS),
        resolver=FakeResolver(),  # type: ignore[arg-type]
    )
    async with serving(service) as stub:
        yield Served(stub=stub, hub=hub, link=link)


def _png(width: int, height: int) -> common_pb2.Image:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format="PNG")
    return common_pb2.Image(data=buffer.getvalue(), media_type="image/png")


def _wav(seconds: float) -> common_pb2.Audio:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16_000)
        writer.writeframes(b"\x00\x00" * int(seconds * 16_000))
    return common_pb2.Audio(data=buffer.getvalue(), media_type="audio/wav")


async def _refusal(call: object) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    info = error_info_of(caught.value)
    assert info is not None
    return caught.value.code(), info.reason, dict(info.metadata)


def _floats(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


async def test_transcribe_sends_the_clip_with_the_seconds_limit_and_costs_its_seconds(
    served: Served,
) -> None:
    segment = common_pb2.TranscriptSegment(start_s=0.0, end_s=2.0, text="hi")
    answer = wg.TranscribeResult(text="hi", language="en", audio_seconds=2.0, segments=[segment])
    served.hub.answers += [
        wg.InvokeResult(transcribe=answer),
        wg.InvokeResult(transcribe=answer),
    ]
    audio = _wav(2.0)
    request = inference_pb2.TranscribeRequest(
        capability="speech", audio=audio, language="en", timestamps=True
    )
    response = await served.stub.Transcribe(request, metadata=served.md)
    assert (response.text, response.language, response.audio_seconds) == ("hi", "en", 2.0)
    assert [(s.start_s, s.end_s, s.text) for s in response.segments] == [(0.0, 2.0, "hi")]
    assert (response.deployment_id, response.node_id) == ("dep-1", "n1")
    [payload] = served.hub.payloads
    assert isinstance(payload, wg.TranscribePayload)
    assert (payload.audio, payload.language, payload.timestamps) == (audio, "en", True)
    assert payload.max_audio_seconds == 10.0
    [work] = served.link.submitted
    assert (work.cost, work.tenant_id, work.capability) == (audio_cost(2.0), "tenant-a", "speech")
    assert served.link.finished == [(scheduler_pb2.WORK_OUTCOME_SUCCESS, "")]

    request.timestamps = False
    response = await served.stub.Transcribe(request, metadata=served.md)
    assert response.text == "hi" and list(response.segments) == []


async def test_the_image_rpcs_send_their_limits_and_cost_their_pixels(served: Served) -> None:
    images = [_png(100, 50), _png(20, 20)]
    pixels = [100 * 50, 20 * 20]
    served.hub.answers += [
        wg.InvokeResult(recognize_text=wg.RecognizeTextResult(texts=["one", "two"])),
        wg.InvokeResult(embed=wg.EmbedResult(count=2, dim=2, float32_le=_floats(1, 0, 0, 1))),
        wg.InvokeResult(
            classify_image=wg.ClassifyImageResult(count=2, labels=2, scores=[0.25, 0.75, 0.5, 0.5])
        ),
    ]
    texts = await served.stub.RecognizeText(
        inference_pb2.RecognizeTextRequest(capability="ocr", images=images), metadata=served.md
    )
    assert list(texts.texts) == ["one", "two"] and texts.node_id == "n1"

    vectors = await served.stub.EmbedImage(
        inference_pb2.EmbedImageRequest(
            capability="clip",
            images=images,
            encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
        ),
        metadata=served.md,
    )
    assert vectors.dim == 2 and vectors.encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES
    assert [v.float32_le for v in vectors.vectors] == [_floats(1, 0), _floats(0, 1)]

    classified = await served.stub.ClassifyImage(
        inference_pb2.ClassifyImageRequest(
            capability="clip", images=images, labels=["cat", "dog"], top_k=1
        ),
        metadata=served.md,
    )
    assert [[(e.label, e.index, e.score) for e in r.labels] for r in classified.results] == [
        [("dog", 1, 0.75)],
        [("cat", 0, 0.5)],  # a tie: the lower index first
    ]

    recognize, embed, classify = served.hub.payloads
    assert isinstance(recognize, wg.RecognizeTextPayload)
    assert isinstance(embed, wg.EmbedImagePayload)
    assert isinstance(classify, wg.ClassifyImagePayload)
    for payload in (recognize, embed, classify):
        assert list(payload.images) == images and payload.max_image_pixels == 1_000_000
    assert list(classify.labels) == ["cat", "dog"]
    assert [work.cost for work in served.link.submitted] == [
        image_cost(pixels),
        image_cost(pixels),
        classify_cost(pixels, ["cat", "dog"]),
    ]


@pytest.mark.parametrize(
    ("rpc", "request_", "reason", "field"),
    [
        (
            "Transcribe",
            inference_pb2.TranscribeRequest(capability="s"),
            "INVALID_ARGUMENT",
            "audio",
        ),
        (
            "Transcribe",
            inference_pb2.TranscribeRequest(capability="s", audio=_wav(11.0)),
            "INVALID_PAYLOAD",
            "audio",
        ),
        (
            "Transcribe",
            inference_pb2.TranscribeRequest(
                capability="s", audio=common_pb2.Audio(data=b"RIFF", media_type="audio/mp3")
            ),
            "INVALID_PAYLOAD",
            "audio.media_type",
        ),
        (
            "RecognizeText",
            inference_pb2.RecognizeTextRequest(capability="o"),
            "INVALID_ARGUMENT",
            "images",
        ),
        (
            "EmbedImage",
            inference_pb2.EmbedImageRequest(capability="c", images=[_png(2, 2)] * 5),
            "INVALID_PAYLOAD",
            "images",
        ),
        (
            "EmbedImage",
            inference_pb2.EmbedImageRequest(capability="c", images=[_png(2, 2), _png(1001, 1000)]),
            "INVALID_PAYLOAD",
            "images[1]",
        ),
        (
            "ClassifyImage",
            inference_pb2.ClassifyImageRequest(capability="c", images=[_png(2, 2)]),
            "INVALID_ARGUMENT",
            "labels",
        ),
        (
            "ClassifyImage",
            inference_pb2.ClassifyImageRequest(
                capability="c", images=[_png(2, 2)], labels=["cat", ""]
            ),
            "EMPTY_INPUT",
            "labels[1]",
        ),
        (
            "ClassifyImage",
            inference_pb2.ClassifyImageRequest(capability="c", labels=["cat"]),
            "INVALID_ARGUMENT",
            "images",
        ),
    ],
)
async def test_a_bad_media_call_is_refused_by_name_before_anything_is_scheduled(
    served: Served, rpc: str, request_: object, reason: str, field: str
) -> None:
    code, got_reason, metadata = await _refusal(
        getattr(served.stub, rpc)(request_, metadata=served.md)
    )
    assert (code, got_reason, metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        reason,
        field,
    )
    assert served.link.submitted == [] and served.hub.payloads == []


async def test_a_worker_score_outside_zero_to_one_fails_the_call_as_infra(served: Served) -> None:
    served.hub.answers.append(
        wg.InvokeResult(classify_image=wg.ClassifyImageResult(count=1, labels=1, scores=[1.5]))
    )
    code, reason, _ = await _refusal(
        served.stub.ClassifyImage(
            inference_pb2.ClassifyImageRequest(capability="c", images=[_png(2, 2)], labels=["x"]),
            metadata=served.md,
        )
    )
    assert (code, reason) == (grpc.StatusCode.INTERNAL, "INVOKE_FAILED")


_GARBAGE = [
    (
        "Transcribe",
        inference_pb2.TranscribeRequest(capability="s", audio=_wav(1.0), timestamps=True),
        wg.InvokeResult(
            transcribe=wg.TranscribeResult(
                audio_seconds=1.0,
                segments=[common_pb2.TranscriptSegment(start_s=math.nan, end_s=1.0)],
            )
        ),
    ),
    (
        "Transcribe",
        inference_pb2.TranscribeRequest(capability="s", audio=_wav(1.0)),
        wg.InvokeResult(transcribe=wg.TranscribeResult(audio_seconds=math.inf)),
    ),
    (
        "RecognizeText",
        inference_pb2.RecognizeTextRequest(capability="o", images=[_png(2, 2), _png(2, 2)]),
        wg.InvokeResult(recognize_text=wg.RecognizeTextResult(texts=["one"])),
    ),
    (
        "EmbedImage",
        inference_pb2.EmbedImageRequest(capability="c", images=[_png(2, 2)]),
        wg.InvokeResult(embed=wg.EmbedResult(count=2, dim=1, float32_le=_floats(1, 2))),
    ),
    (
        "EmbedImage",
        inference_pb2.EmbedImageRequest(capability="c", images=[_png(2, 2)]),
        wg.InvokeResult(embed=wg.EmbedResult(count=1, dim=2, float32_le=_floats(1))),
    ),
    (
        "ClassifyImage",
        inference_pb2.ClassifyImageRequest(capability="c", images=[_png(2, 2)], labels=["x"]),
        wg.InvokeResult(classify_image=wg.ClassifyImageResult(count=1, labels=1, scores=[-0.5])),
    ),
    (
        "ClassifyImage",
        inference_pb2.ClassifyImageRequest(capability="c", images=[_png(2, 2)], labels=["x"]),
        wg.InvokeResult(classify_image=wg.ClassifyImageResult(count=1, labels=2, scores=[0, 1])),
    ),
    (
        "Rerank",
        inference_pb2.RerankRequest(capability="r", query="q", documents=["a", "b"]),
        wg.InvokeResult(rerank=wg.RerankResult(scores=[0.5, math.nan])),
    ),
    (
        "Embed",
        inference_pb2.EmbedRequest(capability="e", inputs=["a"]),
        wg.InvokeResult(embed=wg.EmbedResult(count=1, dim=2, float32_le=_floats(1, 2, 3))),
    ),
]


@pytest.mark.parametrize(
    ("rpc", "request_", "answer"),
    _GARBAGE,
    ids=[
        "nan-segment-time",
        "infinite-clip-length",
        "one-text-for-two-images",
        "two-vectors-for-one-image",
        "short-embedding-block",
        "negative-label-score",
        "score-matrix-of-the-wrong-shape",
        "nan-rerank-score",
        "malformed-embedding-block",
    ],
)
async def test_an_answer_the_control_plane_refuses_is_reported_as_the_residencys_failure(
    served: Served, rpc: str, request_: object, answer: wg.InvokeResult
) -> None:
    # Checked before WorkFinished: the scheduler and the breakers count a model host that
    # returns garbage as an INFRA failure of its residency, never as a success.
    served.hub.answers.append(answer)
    code, reason, _ = await _refusal(getattr(served.stub, rpc)(request_, metadata=served.md))
    assert (code, reason) == (grpc.StatusCode.INTERNAL, "INVOKE_FAILED")
    assert served.link.finished == [(scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE, "INVOKE_FAILED")]
