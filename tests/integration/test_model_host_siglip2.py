"""Image and text embeddings and zero-shot classification in a real model host child on a tiny
random SigLIP2, against transformers alone.

The host runs in the vision environment's python (`.venv-vision`), sandboxed as every host is,
spawned or forked by a warm pool of that environment. Its image vectors for real PNG, JPEG and WebP
bytes, its text vectors and its label probabilities equal a direct run of the same model on the
same bytes in a child of that python (which also makes the images: Pillow lives there): cosine >=
0.9999 and probabilities within 1e-4. A text or label past the text tower's 64 positions is
INPUT_TOO_LONG (truncated on request), bad images are INVALID_PAYLOAD naming the field, a kind the
adapter does not serve is refused, and the host keeps serving. Its probe check passes with measured
memory, and from inside, the host can neither read a file outside its allow-list nor connect out.
Prints load time, memory and per-request latency of both sides (run -s).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.serving import (
    TEST_HOOK_PROBE_MARKER,
    TEST_HOOK_PROBE_SANDBOX_PREFIX,
)
from tests.fixtures import tiny_siglip2
from tests.fixtures.vision_env import kernel_isolation
from tests.integration.harness import shared_warm_pool

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

TIMED_REQUESTS = 5
START_SECONDS: dict[str, float] = {}  # deployment id -> ModelHost.start's wall time
TEXTS = ["a photo of a cat", "Gantry embeds text in the image space", "ÉTÉ 2026!"]
LABELS = ["a photo of a cat", "a photo of a dog", "a line of text"]
LONG_TEXT = "the quick brown fox " * 8  # 160 characters: one token each, past 64
# The direct run, in a child of the vision environment's python: it makes the images (a colour
# ramp as PNG, noise as JPEG, a two-colour picture as lossless WebP), decodes the same bytes as a
# user of transformers would, and runs the towers: raw image and text features, and the model's
# sigmoid probabilities. Texts are padded to 64 positions as SigLIP was trained; images go through
# the artifact's own image processor. It measures its own load, memory and per-request latency.
DIRECT = r"""
import base64, io, json, sys, time
started = time.monotonic()
import numpy as np
import torch
from PIL import Image, ImageDraw
from transformers import AutoModel, AutoProcessor

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

def encoded(image, pillow_format, media_type, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=pillow_format, **options)
    return {"media_type": media_type, "data": base64.b64encode(buffer.getvalue()).decode()}

ramp = np.linspace(0, 255, 40)
channels = np.broadcast_arrays(ramp[None, :], np.full((24, 1), 64.0), 255 - ramp[None, :])
noise = np.random.default_rng(2).random((30, 30, 3)) * 255
picture = Image.new("RGB", (20, 36), (30, 90, 200))
ImageDraw.Draw(picture).ellipse((2, 8, 18, 28), fill=(240, 200, 40))
images = [
    encoded(Image.fromarray(np.stack(channels, -1).astype("uint8")), "PNG", "image/png"),
    encoded(Image.fromarray(noise.astype("uint8")), "JPEG", "image/jpeg", quality=90),
    encoded(picture, "WEBP", "image/webp", lossless=True),
]
request = json.loads(sys.argv[2])
directory = sys.argv[1]
processor = AutoProcessor.from_pretrained(directory, local_files_only=True)
model = AutoModel.from_pretrained(directory, local_files_only=True).eval()

def pixels(encoded_images):
    decoded = [
        Image.open(io.BytesIO(base64.b64decode(image["data"]))).convert("RGB")
        for image in encoded_images
    ]
    return processor.image_processor(decoded, return_tensors="pt")

def text(texts):
    return processor.tokenizer(
        texts, padding="max_length", max_length=64, truncation=True, return_tensors="pt"
    )

with torch.inference_mode():
    image_vectors = model.get_image_features(**pixels(images)).pooler_output
    text_vectors = model.get_text_features(**text(request["texts"])).pooler_output
    truncated = model.get_text_features(**text([request["long_text"]])).pooler_output
    logits = model(**text(request["labels"]), **pixels(images)).logits_per_image
load_seconds = time.monotonic() - started  # imports, load and the first requests
rss_after_load = status("VmRSS")
timings = {"embed_image": [], "embed": [], "classify_image": []}
for _ in range(int(sys.argv[3])):
    with torch.inference_mode():
        begun = time.monotonic()
        model.get_image_features(**pixels(images[:1]))
        timings["embed_image"].append(time.monotonic() - begun)
        begun = time.monotonic()
        model.get_text_features(**text(request["texts"][:1]))
        timings["embed"].append(time.monotonic() - begun)
        begun = time.monotonic()
        torch.sigmoid(model(**text(request["labels"]), **pixels(images[:1])).logits_per_image)
        timings["classify_image"].append(time.monotonic() - begun)
print(json.dumps({
    "images": images,
    "image_vectors": image_vectors.tolist(),
    "text_vectors": text_vectors.tolist(),
    "truncated_vector": truncated[0].tolist(),
    "probabilities": torch.sigmoid(logits).tolist(),
    "load_seconds": load_seconds,
    "rss_bytes": rss_after_load,
    "rss_peak_bytes": status("VmHWM"),
    "request_seconds": timings,
}))
"""


def _spec(model_directory: Path, python: str, deployment_id: str) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=deployment_id,
        model_directory=model_directory,
        adapter=common_pb2.AdapterSettings(
            adapter="transformers_siglip2",
            device="cpu",
            normalize=True,
            # As inspection reads them from the fixture: a NaFlex processor has no image_size.
            image_mean=list(tiny_siglip2.IMAGE_MEAN),
            image_std=list(tiny_siglip2.IMAGE_STD),
        ),
        python_executable=python,
        # The sandbox probe below runs through the test hooks.
        test_hooks=True,
        load_timeout_s=240,
    )


@pytest.fixture(scope="module")
def direct(tiny_siglip2_dir: Path, vision_python: str) -> dict[str, Any]:
    request = json.dumps({"texts": TEXTS, "labels": LABELS, "long_text": LONG_TEXT})
    completed = subprocess.run(
        [vision_python, "-I", "-c", DIRECT, str(tiny_siglip2_dir), request, str(TIMED_REQUESTS)],
        capture_output=True,
        text=True,
        timeout=240,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"},
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def _images(direct: dict[str, Any]) -> list[common_pb2.Image]:
    return [
        common_pb2.Image(data=base64.b64decode(image["data"]), media_type=image["media_type"])
        for image in direct["images"]
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def siglip_host(tiny_siglip2_dir: Path, vision_python: str) -> AsyncIterator[ModelHost]:
    started = time.monotonic()
    host = await ModelHost.start(_spec(tiny_siglip2_dir, vision_python, "dep-siglip2"))
    START_SECONDS[host.deployment_id] = time.monotonic() - started
    try:
        yield host
    finally:
        await host.stop()


def _vectors(result: wg.EmbedResult) -> np.ndarray:
    return np.frombuffer(result.float32_le, dtype="<f4").reshape(result.count, result.dim)


def _cosines(served: np.ndarray, direct: Any) -> np.ndarray:
    expected = np.asarray(direct, dtype=np.float64)
    served = served.astype(np.float64)
    return np.asarray(
        (served * expected).sum(axis=1)
        / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    )


async def _timed(call: Any) -> float:
    timings = []
    for _ in range(TIMED_REQUESTS):
        started = time.monotonic()
        await call()
        timings.append(time.monotonic() - started)
    return statistics.median(timings) * 1000


async def test_image_and_text_vectors_and_label_scores_match_transformers(
    siglip_host: ModelHost, direct: dict[str, Any]
) -> None:
    images = _images(direct)
    assert [image.media_type for image in images] == ["image/png", "image/jpeg", "image/webp"]
    assert siglip_host.ready.dim == tiny_siglip2.HIDDEN

    served = _vectors(
        await siglip_host.embed_image(
            wg.EmbedImagePayload(images=images, max_image_pixels=1_000_000),
            trace_context={},
            timeout_s=60,
        )
    )
    assert served.shape == (3, tiny_siglip2.HIDDEN)
    assert _cosines(served, direct["image_vectors"]).min() >= 0.9999
    # `normalize`: unit rows, where the model's own features are not.
    assert np.allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(np.linalg.norm(direct["image_vectors"], axis=1), 1.0, atol=1e-2)
    # The comparison says something: the three images are three different vectors.
    assert np.abs(np.corrcoef(served)[np.triu_indices(3, 1)]).max() < 0.999

    texts = _vectors(await siglip_host.embed(TEXTS, trace_context={}, timeout_s=60))
    assert texts.shape == (3, tiny_siglip2.HIDDEN)
    assert _cosines(texts, direct["text_vectors"]).min() >= 0.9999

    classified = await siglip_host.classify_image(
        wg.ClassifyImagePayload(images=images, labels=LABELS), trace_context={}, timeout_s=60
    )
    assert (classified.count, classified.labels) == (3, 3)
    probabilities = np.asarray(classified.scores).reshape(3, 3)
    assert np.abs(probabilities - np.asarray(direct["probabilities"])).max() <= 1e-4
    assert ((probabilities > 0) & (probabilities < 1)).all()

    one = wg.EmbedImagePayload(images=images[:1])
    image_ms = await _timed(lambda: siglip_host.embed_image(one, trace_context={}, timeout_s=60))
    text_ms = await _timed(lambda: siglip_host.embed(TEXTS[:1], trace_context={}, timeout_s=60))
    classify = wg.ClassifyImagePayload(images=images[:1], labels=LABELS)
    classify_ms = await _timed(
        lambda: siglip_host.classify_image(classify, trace_context={}, timeout_s=60)
    )
    probe = await siglip_host.probe_check(timeout_s=60)
    timings = {
        kind: statistics.median(values) * 1000 for kind, values in direct["request_seconds"].items()
    }
    print(
        f"\ntiny siglip2: load host {siglip_host.ready.load_seconds:.2f}s in the child "
        f"({START_SECONDS[siglip_host.deployment_id]:.2f}s ModelHost.start) vs direct "
        f"{direct['load_seconds']:.2f}s (imports, load, first requests); RSS after load host "
        f"{siglip_host.ready.rss_bytes / 2**20:.0f} MiB vs direct "
        f"{direct['rss_bytes'] / 2**20:.0f} MiB, peak host "
        f"{probe.memory.rss_peak.bytes / 2**20:.0f} MiB vs direct "
        f"{direct['rss_peak_bytes'] / 2**20:.0f} MiB; median of {TIMED_REQUESTS}: embed_image "
        f"(1 PNG) host {image_ms:.1f} ms vs direct {timings['embed_image']:.1f} ms, embed (1 "
        f"text) {text_ms:.1f} vs {timings['embed']:.1f} ms, classify_image (1 PNG, 3 labels) "
        f"{classify_ms:.1f} vs {timings['classify_image']:.1f} ms"
    )


async def test_texts_and_labels_past_the_text_tower_are_refused_unless_truncated(
    siglip_host: ModelHost, direct: dict[str, Any]
) -> None:
    with pytest.raises(GantryError) as caught:
        await siglip_host.embed(["a cat", LONG_TEXT], trace_context={}, timeout_s=60)
    error = caught.value
    assert error.reason == "INPUT_TOO_LONG" and error.failure_class is FailureClass.REQUEST
    assert error.metadata["field"] == "inputs[1]" and error.metadata["limit"] == "64"
    truncated = _vectors(
        await siglip_host.embed([LONG_TEXT], trace_context={}, timeout_s=60, truncate=True)
    )
    assert _cosines(truncated, [direct["truncated_vector"]]).min() >= 0.9999

    images = _images(direct)
    with pytest.raises(GantryError) as caught:
        await siglip_host.classify_image(
            wg.ClassifyImagePayload(images=images, labels=["a cat", LONG_TEXT]),
            trace_context={},
            timeout_s=60,
        )
    assert caught.value.reason == "INPUT_TOO_LONG"
    assert caught.value.metadata["field"] == "labels[1]"
    with pytest.raises(GantryError) as caught:
        await siglip_host.classify_image(
            wg.ClassifyImagePayload(images=images), trace_context={}, timeout_s=60
        )
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["field"] == "labels"


async def test_bad_images_and_unserved_kinds_are_refused_and_the_host_keeps_serving(
    siglip_host: ModelHost, direct: dict[str, Any]
) -> None:
    png, jpeg, webp = _images(direct)
    junk = common_pb2.Image(data=jpeg.data[:40], media_type="image/jpeg")
    for call in (
        siglip_host.embed_image(
            wg.EmbedImagePayload(images=[png, junk]), trace_context={}, timeout_s=60
        ),
        siglip_host.classify_image(
            wg.ClassifyImagePayload(images=[png, junk], labels=LABELS),
            trace_context={},
            timeout_s=60,
        ),
    ):
        with pytest.raises(GantryError) as caught:
            await call
        assert caught.value.reason == "INVALID_PAYLOAD"
        assert caught.value.metadata["field"] == "images[1]"
    mislabelled = common_pb2.Image(data=webp.data, media_type="image/png")
    with pytest.raises(GantryError) as caught:
        await siglip_host.embed_image(
            wg.EmbedImagePayload(images=[mislabelled]), trace_context={}, timeout_s=60
        )
    assert caught.value.metadata["field"] == "images[0].media_type"
    # The PNG is 40 x 24 = 960 pixels.
    with pytest.raises(GantryError) as caught:
        await siglip_host.embed_image(
            wg.EmbedImagePayload(images=[webp, png], max_image_pixels=959),
            trace_context={},
            timeout_s=60,
        )
    assert caught.value.metadata == {
        "field": "images[1]",
        "setting": "max_image_pixels",
        "limit": "959",
        "value": "960",
    }
    with pytest.raises(GantryError) as caught:
        await siglip_host.recognize_text(
            wg.RecognizeTextPayload(images=[png]), trace_context={}, timeout_s=60
        )
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["adapter"] == "transformers_siglip2"
    assert "cannot answer recognize_text requests" in caught.value.message
    with pytest.raises(GantryError) as caught:
        await siglip_host.rerank("query", ["document"], trace_context={}, timeout_s=60)
    assert caught.value.reason == "INVALID_PAYLOAD"

    assert siglip_host.alive
    again = _vectors(
        await siglip_host.embed_image(
            wg.EmbedImagePayload(images=[png]), trace_context={}, timeout_s=60
        )
    )
    assert _cosines(again, direct["image_vectors"][:1]).min() >= 0.9999


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "node.credential"
    secret.parent.mkdir()
    secret.write_text("nc_fake_node_credential\n")
    secret.chmod(0o644)
    return secret


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def test_the_probe_passes_with_measured_memory_and_the_sandbox_holds_from_inside(
    siglip_host: ModelHost, secret_file: Path, listening_port: int
) -> None:
    ready = siglip_host.ready
    assert ready.runtime_versions["torch"].startswith("2.14.")  # the vision environment's torch
    assert ready.runtime_versions["torchvision"] and ready.runtime_versions["pillow"]
    assert ready.isolation == kernel_isolation(), ready.isolation_reason
    probe = await siglip_host.probe_check(timeout_s=60)
    assert probe.health.model.status == wg.HEALTH_STATUS_OK, probe.health.model.detail
    assert list(probe.output_shape) == [1, tiny_siglip2.HIDDEN] and probe.output_finite
    # The memory is read after the worst case: the batch size's images, then as many texts,
    # each padded to the text tower's positions.
    worst = probe.worst_case
    assert worst.ran and (worst.batch_inputs, worst.input_tokens) == (
        32,
        tiny_siglip2.TEXT_POSITIONS,
    )
    memory = probe.memory
    assert memory.rss_peak.source == "/proc/self/status VmHWM"
    assert memory.rss_peak.bytes >= memory.rss_current.bytes > 0
    assert memory.cuda_allocated_after_load.unavailable == "device is cpu"
    assert probe.offline.network_guard and probe.offline.offline_env["HF_HUB_OFFLINE"] == "1"

    # The test hook's probe (serving.py) from inside the host: read the file, connect out. Its
    # input is a path, past 64 tokens: truncated here, as the hook reads the request untruncated.
    with pytest.raises(GantryError) as failure:
        await siglip_host.embed(
            [f"{TEST_HOOK_PROBE_SANDBOX_PREFIX}{secret_file}:{listening_port}"],
            trace_context={},
            timeout_s=30,
            truncate=True,
        )
    assert TEST_HOOK_PROBE_MARKER in failure.value.message, failure.value.message
    report = json.loads(failure.value.message.split(TEST_HOOK_PROBE_MARKER, 1)[1])
    if ready.isolation.startswith("LANDLOCK_FS"):
        assert report["read"] == "denied EACCES"
    if ready.isolation.startswith("LANDLOCK_FS_NET"):
        assert report["connect"] == "denied EACCES"
    assert report["isolated_flag"] == 1
    environ = report["environ"]
    assert isinstance(environ, dict) and environ["HF_HUB_OFFLINE"] == "1"
    assert siglip_host.alive


async def test_a_host_forked_by_a_warm_pool_of_the_vision_environment_serves_the_same(
    tiny_siglip2_dir: Path, vision_python: str, siglip_host: ModelHost, direct: dict[str, Any]
) -> None:
    pool = shared_warm_pool()
    forked = await ModelHost.start(
        _spec(tiny_siglip2_dir, vision_python, "dep-siglip2-forked"), warm_pool=pool
    )
    try:
        server = pool.server_for_environment(vision_python, dict(os.environ))
        assert server is not None and server.alive
        assert server.key.python_executable == vision_python
        stat = Path(f"/proc/{forked.pid}/stat").read_text()
        assert int(stat[stat.rindex(")") + 2 :].split()[1]) == os.getpid()  # reaped by us
        assert forked.ready.isolation == siglip_host.ready.isolation
        vectors = _vectors(
            await forked.embed_image(
                wg.EmbedImagePayload(images=_images(direct)), trace_context={}, timeout_s=60
            )
        )
        assert _cosines(vectors, direct["image_vectors"]).min() >= 0.9999
        print(
            f"\ntiny siglip2 forked by the warm pool: ready in {forked.ready.load_seconds:.2f}s "
            f"(spawned: {siglip_host.ready.load_seconds:.2f}s)"
        )
    finally:
        await forked.stop()
