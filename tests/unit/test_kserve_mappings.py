"""Each capability kind's tensors become the gantry.v1 request its handler answers, and the answer
becomes its output tensors (kserve/mappings.py), against a fake Inference service that records
what it was asked: no server."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.serving.kserve.mappings import (
    GENERATION,
    IMAGE,
    RERANK,
    TRANSCRIPTION,
    Call,
)
from gantry.controlplane.serving.kserve.tensors import InputTensor
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
WAV = b"RIFF\x00\x00\x00\x00WAVEfmt "


class FakeInference:
    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.asked: list[Any] = []

    def __getattr__(self, rpc: str) -> Any:
        async def call(request: Any, context: Any) -> Any:
            self.asked.append(request)
            return self.answers[rpc]

        return call


def _call(fake: FakeInference, *tensors: InputTensor) -> Call:
    return Call(
        capability="cap",
        tensors={t.name: t for t in tensors},
        priority=common_pb2.PRIORITY_BATCH,
        truncate=False,
        inference=fake,  # type: ignore[arg-type]
        context=None,  # type: ignore[arg-type]
    )


def _tensor(name: str, datatype: str, *values: Any, shape: tuple[int, ...] = ()) -> InputTensor:
    return InputTensor(
        name=name, datatype=datatype, shape=shape or (len(values),), values=tuple(values)
    )


async def test_generation_maps_text_input_and_sampling_to_generate() -> None:
    fake = FakeInference(
        Generate=inf.GenerateResponse(
            text="world", finish_reason=common_pb2.FINISH_REASON_LENGTH, deployment_id="d"
        )
    )
    answer = await GENERATION.infer(
        _call(
            fake,
            _tensor("text_input", "BYTES", b"hello"),
            _tensor("max_tokens", "INT32", 5),
            _tensor("stop", "BYTES", b"\n", b"."),
            _tensor("temperature", "FP32", 0.5),
            _tensor("seed", "UINT64", 2**40),
        )
    )
    (request,) = fake.asked
    assert (request.capability, request.prompt, request.max_tokens) == ("cap", "hello", 5)
    assert list(request.stop) == ["\n", "."] and request.priority == common_pb2.PRIORITY_BATCH
    assert (request.sampling.temperature, request.sampling.seed) == (0.5, 2**40)
    text, reason = answer.outputs
    assert (text.name, text.raw) == ("text_output", struct.pack("<I", 5) + b"world")
    assert (reason.name, reason.raw) == ("finish_reason", struct.pack("<I", 6) + b"length")
    assert answer.deployment_id == "d"


async def test_rerank_scores_come_back_in_the_documents_order() -> None:
    fake = FakeInference(
        Rerank=inf.RerankResponse(
            results=[
                inf.RankedDocument(index=1, score=0.75),
                inf.RankedDocument(index=0, score=0.5),
            ]
        )
    )
    answer = await RERANK.infer(
        _call(fake, _tensor("query", "BYTES", b"q"), _tensor("documents", "BYTES", b"a", b"b"))
    )
    assert list(fake.asked[0].documents) == ["a", "b"] and fake.asked[0].top_n == 0
    (scores,) = answer.outputs
    assert (scores.shape, struct.unpack("<2f", scores.raw)) == ((2,), (0.5, 0.75))


async def test_images_with_labels_are_classified_into_an_images_by_labels_tensor() -> None:
    fake = FakeInference(
        ClassifyImage=inf.ClassifyImageResponse(
            results=[
                inf.ImageClassification(
                    labels=[
                        inf.LabelScore(index=1, score=0.75),
                        inf.LabelScore(index=0, score=0.25),
                    ]
                )
            ]
        )
    )
    answer = await IMAGE.infer(
        _call(fake, _tensor("image", "BYTES", PNG), _tensor("labels", "BYTES", b"cat", b"dog"))
    )
    (request,) = fake.asked
    assert request.images[0].media_type == "image/png" and list(request.labels) == ["cat", "dog"]
    (scores,) = answer.outputs
    assert (scores.shape, struct.unpack("<2f", scores.raw)) == ((1, 2), (0.25, 0.75))


async def test_audio_is_sent_with_the_type_its_bytes_say() -> None:
    fake = FakeInference(Transcribe=inf.TranscribeResponse(text="hi"))
    await TRANSCRIPTION.infer(_call(fake, _tensor("audio", "BYTES", WAV)))
    assert fake.asked[0].audio.media_type == "audio/wav"


@pytest.mark.parametrize(
    ("mapping", "tensors", "field"),
    [
        (GENERATION, [], "text_input"),
        (GENERATION, [_tensor("text_input", "BYTES", b"a", b"b")], "text_input"),
        (GENERATION, [_tensor("text_input", "INT32", 1)], "text_input"),
        (
            GENERATION,
            [_tensor("text_input", "BYTES", b"x"), _tensor("max_tokens", "FP32", 1.0)],
            "max_tokens",
        ),
        (TRANSCRIPTION, [_tensor("audio", "BYTES", b"not audio")], "audio"),
        (IMAGE, [_tensor("image", "BYTES", b"GIF89a")], "image"),
        (IMAGE, [_tensor("text", "BYTES", b"x"), _tensor("image", "BYTES", PNG)], "text"),
        (
            RERANK,
            [_tensor("query", "BYTES", b"\xff"), _tensor("documents", "BYTES", b"a")],
            "query",
        ),
    ],
)
async def test_a_bad_input_is_refused_naming_the_tensor(
    mapping: Any, tensors: list[InputTensor], field: str
) -> None:
    with pytest.raises(GantryError) as caught:
        await mapping.infer(_call(FakeInference(), *tensors))
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == field
