"""A tiny TrOCR and a tiny SigLIP2 through every gate of the evidence pipeline with a real worker
whose vision environment (`.venv-vision`, `make vision-env`) is mapped as "vision", then served over
gRPC (control plane -> scheduler -> worker -> model host) on SQLite and PostgreSQL.

Both are assessed in "vision" (each inspection names its adapter), profiled (the image size, mean
and std bound from what the inspection read), probed (a LAB_READY candidate with a measured peak
RSS and verified reclaim), approved and deployed to READY (vision_support.py walks them, once per
database). RecognizeText reads PNG, JPEG and WebP bytes exactly as a direct transformers run of the
same model on the same bytes does; EmbedImage and Embed on the SigLIP2 deployment give the direct
run's vectors in both encodings; ClassifyImage ranks the labels by the direct run's probabilities
and honours top_k. Bad images, a missing part or an empty label are refused by name before
anything is scheduled (an image whose header reads but whose body does not, by the model host);
work a deployment's adapter does not do is its model host's INVALID_PAYLOAD; none of it moves a
deployment off READY. An operator's grpcurl with a base64 PNG in JSON gets the same text.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import numpy as np
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.fixtures import tiny_siglip2, tiny_trocr
from tests.integration.kserve_support import infer_grpc, infer_rest
from tests.integration.pipeline_support import refusal_with_metadata
from tests.integration.test_model_host_siglip2 import LABELS, TEXTS
from tests.integration.test_transcribe_rpc import GRPCURL
from tests.integration.test_transcribe_rpc import _grpcurl as grpcurl
from tests.integration.vision_support import (  # noqa: F401  (the `direct` and `vision` fixtures)
    FLOAT32_LE,
    FLOAT_LIST,
    IMAGES,
    OCR,
    PIXEL_LIMIT,
    READY,
    SIGLIP2,
    TROCR,
    VISION,
    Direct,
    Vision,
    cosines,
    direct_fixture,
    vectors,
    vision_fixture,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]


def _floats(values: Iterable[Any]) -> list[float]:
    return [round(float(value), 6) for value in values]


async def test_each_model_passes_every_gate_in_the_vision_environment(vision: Vision) -> None:
    expected = {
        TROCR: (
            "image-to-text",
            tiny_trocr.IMAGE_SIZE,
            tiny_trocr.IMAGE_MEAN,
            tiny_trocr.IMAGE_STD,
        ),
        # A NaFlex processor resizes by patches: there is no image size to bind.
        SIGLIP2: (
            "zero-shot-image-classification",
            0,
            tiny_siglip2.IMAGE_MEAN,
            tiny_siglip2.IMAGE_STD,
        ),
    }
    for walked in (vision.trocr, vision.siglip2):
        adapter = walked.profile.adapter.adapter
        task, size, mean, std = expected[adapter]
        assessment = walked.assessment
        assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED, assessment
        assert assessment.environment_id == VISION and assessment.environment_fingerprint
        inspection = assessment.inspection
        assert (inspection.inspector, inspection.task) == ("transformers", task)
        assert list(inspection.adapters) == [adapter] and inspection.executable
        details = inspection.details
        assert _floats(details["image_mean"].split(",")) == _floats(mean)
        assert _floats(details["image_std"].split(",")) == _floats(std)
        assert details.get("image_size", "0") == str(size)

        # The operator set no preprocessing: the profile binds what the inspection read.
        profile = walked.profile
        assert profile.environment_id == VISION
        assert profile.adapter.image_size == size
        assert _floats(profile.adapter.image_mean) == _floats(mean)
        assert _floats(profile.adapter.image_std) == _floats(std)

        probe, evidence = walked.probe, walked.probe.evidence
        assert probe.state == common_pb2.PROBE_STATE_COMPLETED
        assert (evidence.environment_id, evidence.adapter) == (VISION, adapter)
        assert evidence.environment_fingerprint == assessment.environment_fingerprint
        assert evidence.runtime_versions["torch"].startswith("2.14.")  # the vision torch
        assert evidence.output_finite and evidence.output_shape
        # Observed by the child: its weights read from the verified copy alone, no model code.
        assert list(evidence.offline.weight_files) == ["model.safetensors"]
        assert not evidence.offline.weight_files_outside_copy
        assert not evidence.offline.remote_code_modules
        memory = evidence.memory
        assert memory.rss_peak.WhichOneof("value") == "bytes", memory.rss_peak  # measured
        assert "VmHWM" in memory.rss_peak.source
        assert memory.rss_peak.bytes >= memory.rss_current.bytes > 0
        assert evidence.reclaim.reclaimed and evidence.reclaim.reaped, evidence.reclaim
        assert walked.candidate.status == cp.CANDIDATE_STATUS_LAB_READY
        assert profile.ram_envelope_bytes >= memory.rss_peak.bytes  # measured, not estimated

        deployment = walked.deployment
        assert deployment.state == READY and deployment.residencies
        assert (deployment.adapter.adapter, deployment.adapter.image_size) == (adapter, size)
        assert _floats(deployment.adapter.image_mean) == _floats(mean)


async def test_recognize_text_reads_png_jpeg_and_webp_as_transformers_does(
    vision: Vision, direct: Direct
) -> None:
    harness, images = vision.harness, direct.trocr_images
    assert [image.media_type for image in images] == ["image/png", "image/jpeg", "image/webp"]
    # The comparison says something: the random model reads each image differently.
    assert len(set(direct.texts)) == len(images) and all(direct.texts)
    served = await harness.inference.RecognizeText(
        inf.RecognizeTextRequest(capability=OCR, images=images), metadata=harness.client_md
    )
    assert list(served.texts) == direct.texts
    assert served.deployment_id == vision.trocr.deployment.deployment_id and served.node_id
    for image, text in zip(images, direct.texts, strict=True):  # one format per call, too
        alone = await harness.inference.RecognizeText(
            inf.RecognizeTextRequest(capability=OCR, images=[image]), metadata=harness.client_md
        )
        assert list(alone.texts) == [text], image.media_type


async def test_embed_image_and_embed_give_the_direct_vectors_in_both_encodings(
    vision: Vision, direct: Direct
) -> None:
    harness, images = vision.harness, direct.siglip2_images
    assert [image.media_type for image in images] == ["image/png", "image/jpeg", "image/webp"]
    deployment_id = vision.siglip2.deployment.deployment_id
    for encoding in (FLOAT_LIST, FLOAT32_LE):
        embedded = await harness.inference.EmbedImage(
            inf.EmbedImageRequest(capability=IMAGES, images=images, encoding=encoding),
            metadata=harness.client_md,
        )
        assert (embedded.dim, embedded.deployment_id) == (tiny_siglip2.HIDDEN, deployment_id)
        served = vectors(embedded, encoding)
        assert served.shape == direct.image_vectors.shape
        assert cosines(served, direct.image_vectors).min() >= 0.9999
        texts = await harness.inference.Embed(
            inf.EmbedRequest(capability=IMAGES, inputs=TEXTS, encoding=encoding),
            metadata=harness.client_md,
        )
        assert (texts.dim, texts.deployment_id) == (tiny_siglip2.HIDDEN, deployment_id)
        served_texts = vectors(texts, encoding)
        assert served_texts.shape == direct.text_vectors.shape
        assert cosines(served_texts, direct.text_vectors).min() >= 0.9999
    # The comparison says something: three images, three different directions.
    unit = direct.image_vectors / np.linalg.norm(direct.image_vectors, axis=1, keepdims=True)
    assert np.abs(unit @ unit.T)[np.triu_indices(3, 1)].max() < 0.999


async def test_classify_image_ranks_the_direct_probabilities_and_honours_top_k(
    vision: Vision, direct: Direct
) -> None:
    harness, images = vision.harness, direct.siglip2_images
    expected = direct.probabilities
    assert expected.shape == (len(images), len(LABELS))
    # The ranking says something: no two labels of an image are within the tolerance.
    assert all(np.diff(np.sort(row)).min() > 2e-4 for row in expected), expected

    def request(top_k: int) -> inf.ClassifyImageRequest:
        return inf.ClassifyImageRequest(
            capability=IMAGES, images=images, labels=LABELS, top_k=top_k
        )

    every = await harness.inference.ClassifyImage(request(0), metadata=harness.client_md)
    assert every.deployment_id == vision.siglip2.deployment.deployment_id and every.node_id
    assert len(every.results) == len(images)
    for row, result in zip(expected, every.results, strict=True):
        ranked = sorted(range(len(LABELS)), key=lambda index: -row[index])
        assert [score.index for score in result.labels] == ranked
        assert [score.label for score in result.labels] == [LABELS[i] for i in ranked]
        served = np.asarray([score.score for score in result.labels])
        assert np.abs(served - row[ranked]).max() <= 1e-4
    top = await harness.inference.ClassifyImage(request(2), metadata=harness.client_md)
    assert len(top.results) == len(images)
    for full, result in zip(every.results, top.results, strict=True):
        assert [s.index for s in result.labels] == [s.index for s in full.labels[:2]]
        assert _floats(s.score for s in result.labels) == _floats(s.score for s in full.labels[:2])


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_bad_calls_are_refused_by_name_and_both_deployments_stay_ready(
    vision: Vision, direct: Direct
) -> None:
    harness = vision.harness
    rpc, client = harness.inference, harness.client_md
    png = direct.trocr_images[0]
    Image = common_pb2.Image

    def ocr(*images: common_pb2.Image, capability: str = OCR) -> Callable[[], Awaitable[Any]]:
        request = inf.RecognizeTextRequest(capability=capability, images=images)
        return lambda: rpc.RecognizeText(request, metadata=client)

    def classify(
        *labels: str, images: tuple[common_pb2.Image, ...] = (png,), capability: str = IMAGES
    ) -> Callable[[], Awaitable[Any]]:
        request = inf.ClassifyImageRequest(capability=capability, images=images, labels=labels)
        return lambda: rpc.ClassifyImage(request, metadata=client)

    def embed_image(*images: common_pb2.Image, capability: str) -> Callable[[], Awaitable[Any]]:
        request = inf.EmbedImageRequest(capability=capability, images=images)
        return lambda: rpc.EmbedImage(request, metadata=client)

    over = {"setting": "max_image_pixels", "limit": str(PIXEL_LIMIT), "value": "10100"}
    refusals: list[tuple[Callable[[], Awaitable[Any]], str, dict[str, str]]] = [
        (ocr(png, Image(data=b"not an image", media_type="image/png")), "INVALID_PAYLOAD",
         {"field": "images[1]"}),
        (ocr(Image(data=png.data, media_type="image/jpeg")), "INVALID_PAYLOAD",
         {"field": "images[0].media_type"}),
        (ocr(Image(data=png.data, media_type="image/gif")), "INVALID_PAYLOAD",
         {"field": "images[0].media_type"}),
        (ocr(png, Image(data=_png(101, 100), media_type="image/png")), "INVALID_PAYLOAD",
         {"field": "images[1]", **over}),
        (ocr(), "INVALID_ARGUMENT", {"field": "images"}),
        (embed_image(capability=IMAGES), "INVALID_ARGUMENT", {"field": "images"}),
        (classify("a cat", images=()), "INVALID_ARGUMENT", {"field": "images"}),
        (classify(), "INVALID_ARGUMENT", {"field": "labels"}),
        (classify("a cat", ""), "EMPTY_INPUT", {"field": "labels[1]"}),
        # The header reads and the body does not: the model host's refusal, through the path.
        (ocr(png, Image(data=png.data[: len(png.data) // 2], media_type="image/png")),
         "INVALID_PAYLOAD", {"field": "images[1]"}),
    ]  # fmt: skip
    for call, reason, metadata in refusals:
        code, got, details = await refusal_with_metadata(call())
        assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, reason), details
        assert {key: details.get(key) for key in metadata} == metadata, details

    # Work a deployment's adapter does not do: its model host's refusal, repeated (a refusal is
    # not a fault the breakers count).
    unserved = [
        (ocr(png, capability=IMAGES), SIGLIP2),
        (classify("a cat", capability=OCR), TROCR),
        (embed_image(png, capability=OCR), TROCR),
    ]
    for _ in range(3):
        for call, adapter in unserved:
            code, reason, details = await refusal_with_metadata(call())
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
            assert details.get("adapter") == adapter, details

    for walked in (vision.trocr, vision.siglip2):
        still = await harness.deployment(walked.deployment.deployment_id)
        assert still.state == READY
        assert [r.residency_id for r in still.residencies] == [
            r.residency_id for r in walked.deployment.residencies
        ]
    served = await ocr(png)()
    assert list(served.texts) == direct.texts[:1]
    embedded = await embed_image(direct.siglip2_images[0], capability=IMAGES)()
    assert cosines(vectors(embedded, FLOAT_LIST), direct.image_vectors[:1]).min() >= 0.9999


async def test_grpcurl_reads_a_base64_png_as_the_readme_shows(
    vision: Vision, direct: Direct
) -> None:
    assert GRPCURL.exists(), f"{GRPCURL} is missing (requirements-dev.txt installs it)"
    png = direct.trocr_images[0]
    body = {
        "capability": OCR,
        "images": [{"data": base64.b64encode(png.data).decode(), "mediaType": "image/png"}],
    }
    answer = await asyncio.to_thread(
        grpcurl, vision.harness, "gantry.v1.Inference/RecognizeText", body
    )
    assert answer["texts"] == direct.texts[:1]
    assert answer["deployment_id"] == vision.trocr.deployment.deployment_id  # grpcurl's names


async def test_images_through_the_open_inference_protocol_are_the_gantry_v1_answers(
    vision: Vision, direct: Direct
) -> None:
    """EmbedImage, ClassifyImage and RecognizeText as KServe tensors (`image`, `labels` BYTES),
    over the gRPC door and the REST one (binary tensors): bit for bit the gantry.v1 answers."""
    harness, md = vision.harness, vision.harness.client_md
    images, scanned = direct.siglip2_images, direct.trocr_images
    embedded = await harness.inference.EmbedImage(
        inf.EmbedImageRequest(capability=IMAGES, images=images, encoding=FLOAT32_LE), metadata=md
    )
    classified = await harness.inference.ClassifyImage(
        inf.ClassifyImageRequest(capability=IMAGES, images=images, labels=LABELS), metadata=md
    )
    scores = np.zeros((len(images), len(LABELS)), dtype=np.float32)
    for row, result in enumerate(classified.results):  # by score: the tensor is in label order
        for scored in result.labels:
            scores[row, scored.index] = scored.score
    recognized = await harness.inference.RecognizeText(
        inf.RecognizeTextRequest(capability=OCR, images=scanned), metadata=md
    )
    image_bytes = [image.data for image in images]
    labels = [label.encode() for label in LABELS]
    for infer in (infer_grpc, infer_rest):
        got = await infer(harness, IMAGES, {"image": image_bytes})
        np.testing.assert_array_equal(got["embedding"], vectors(embedded, FLOAT32_LE))
        got = await infer(harness, IMAGES, {"image": image_bytes, "labels": labels})
        np.testing.assert_array_equal(got["scores"], scores)
        got = await infer(harness, OCR, {"image": [image.data for image in scanned]})
        assert got["text"] == [text.encode() for text in recognized.texts]
    assert list(recognized.texts) == direct.texts  # the comparisons say something
