"""Text recognition in a real model host child on a tiny random TrOCR, against transformers alone.

The host runs in the vision environment's python (`.venv-vision`), sandboxed as every host is. Its
texts for real PNG, JPEG and WebP bytes equal a direct greedy `generate` of the same model on the
same bytes in a child of that python (which also makes the images: Pillow lives there); a batch
reads as its images one by one. Malformed bytes, a wrong media type and an image past the pixel
limit are INVALID_PAYLOAD naming the field, a kind the adapter does not serve is refused, and the
host keeps serving. Its probe check passes with measured memory; a profile whose preprocessing
disagrees with the artifact's processor is refused at load. Prints load time, memory and
per-request latency of both sides (run -s).
"""

from __future__ import annotations

import base64
import json
import statistics
import struct
import subprocess
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from tests.fixtures import tiny_trocr
from tests.fixtures.vision_env import kernel_isolation

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

TIMED_REQUESTS = 5
START_SECONDS: dict[str, float] = {}  # deployment id -> ModelHost.start's wall time
# The direct run, in a child of the vision environment's python: it makes the images (a rendered
# line of text as PNG, a gradient as JPEG, noise as lossless WebP), decodes the same bytes as a
# user of transformers would, and generates greedily; it measures its own load, memory and
# per-request latency.
DIRECT = r"""
import base64, io, json, sys, time
started = time.monotonic()
import numpy as np
import torch
from PIL import Image, ImageDraw
from transformers import TrOCRProcessor, VisionEncoderDecoderModel

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

def encoded(image, pillow_format, media_type, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=pillow_format, **options)
    return {"media_type": media_type, "data": base64.b64encode(buffer.getvalue()).decode()}

line = Image.new("RGB", (160, 40), "white")
ImageDraw.Draw(line).text((4, 12), "Gantry 123", fill="black")
ramp = np.linspace(0, 255, 48)
channels = np.broadcast_arrays(ramp[None, :], np.full((48, 1), 128.0), 255 - ramp[:, None])
gradient = np.stack(channels, -1)
noise = np.random.default_rng(1).random((40, 40, 3)) * 255
images = [
    encoded(line, "PNG", "image/png"),
    encoded(Image.fromarray(gradient.astype("uint8")), "JPEG", "image/jpeg", quality=90),
    encoded(Image.fromarray(noise.astype("uint8")), "WEBP", "image/webp", lossless=True),
]

directory = sys.argv[1]
processor = TrOCRProcessor.from_pretrained(directory, local_files_only=True)
model = VisionEncoderDecoderModel.from_pretrained(directory, local_files_only=True).eval()

def read(data):
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    pixel_values = processor(images=image, return_tensors="pt").pixel_values
    with torch.inference_mode():
        ids = model.generate(pixel_values, num_beams=1, do_sample=False)
    return ids[0].tolist(), processor.batch_decode(ids, skip_special_tokens=True)[0]

results = [read(image["data"]) for image in images]
load_seconds = time.monotonic() - started  # imports, load and the first requests
rss_after_load = status("VmRSS")
timings = []
for _ in range(int(sys.argv[2])):
    begun = time.monotonic()
    read(images[0]["data"])
    timings.append(time.monotonic() - begun)
print(json.dumps({
    "images": images,
    "ids": [ids for ids, _ in results],
    "texts": [text for _, text in results],
    "load_seconds": load_seconds,
    "rss_bytes": rss_after_load,
    "rss_peak_bytes": status("VmHWM"),
    "request_seconds": timings,
}))
"""


def _settings(**overrides: Any) -> common_pb2.AdapterSettings:
    fields: dict[str, Any] = {
        "adapter": "transformers_trocr",
        "device": "cpu",
        # As inspection reads them from the fixture's preprocessor_config.json.
        "image_size": tiny_trocr.IMAGE_SIZE,
        "image_mean": list(tiny_trocr.IMAGE_MEAN),
        "image_std": list(tiny_trocr.IMAGE_STD),
    }
    fields.update(overrides)
    return common_pb2.AdapterSettings(**fields)


def _spec(model_directory: Path, python: str, **overrides: Any) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id="dep-trocr",
        model_directory=model_directory,
        adapter=_settings(**overrides),
        python_executable=python,
        load_timeout_s=240,
    )


@pytest.fixture(scope="module")
def direct(tiny_trocr_dir: Path, vision_python: str) -> dict[str, Any]:
    completed = subprocess.run(
        [vision_python, "-I", "-c", DIRECT, str(tiny_trocr_dir), str(TIMED_REQUESTS)],
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
async def trocr_host(tiny_trocr_dir: Path, vision_python: str) -> AsyncIterator[ModelHost]:
    started = time.monotonic()
    host = await ModelHost.start(_spec(tiny_trocr_dir, vision_python))
    START_SECONDS[host.deployment_id] = time.monotonic() - started
    try:
        yield host
    finally:
        await host.stop()


async def _refusal(host: ModelHost, payload: wg.RecognizeTextPayload) -> GantryError:
    with pytest.raises(GantryError) as caught:
        await host.recognize_text(payload, trace_context={}, timeout_s=60)
    error = caught.value
    assert error.reason == "INVALID_PAYLOAD", error
    assert error.failure_class is FailureClass.REQUEST
    return error


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims `width` x `height`, followed by a few bytes of pixel data only."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


async def test_the_host_reads_each_image_as_transformers_does(
    trocr_host: ModelHost, direct: dict[str, Any]
) -> None:
    images = _images(direct)
    assert [image.media_type for image in images] == ["image/png", "image/jpeg", "image/webp"]
    served = await trocr_host.recognize_text(
        wg.RecognizeTextPayload(images=images, max_image_pixels=1_000_000),
        trace_context={},
        timeout_s=60,
    )
    assert list(served.texts) == direct["texts"]
    # The comparison says something: the random model reads each image differently, and generated
    # more than its start and end tokens.
    assert len(set(direct["texts"])) == len(images)
    assert all(len(ids) > 2 for ids in direct["ids"])
    # One at a time, each image reads as it did in the batch.
    for image, text in zip(images, direct["texts"], strict=True):
        alone = await trocr_host.recognize_text(
            wg.RecognizeTextPayload(images=[image]), trace_context={}, timeout_s=60
        )
        assert list(alone.texts) == [text]

    timings = []
    for _ in range(TIMED_REQUESTS):
        started = time.monotonic()
        await trocr_host.recognize_text(
            wg.RecognizeTextPayload(images=images[:1]), trace_context={}, timeout_s=60
        )
        timings.append(time.monotonic() - started)
    probe = await trocr_host.probe_check(timeout_s=60)
    start_seconds = START_SECONDS[trocr_host.deployment_id]
    print(
        f"\ntiny trocr: load host {trocr_host.ready.load_seconds:.2f}s in the child "
        f"({start_seconds:.2f}s ModelHost.start, spawn and imports) vs direct "
        f"{direct['load_seconds']:.2f}s (imports, load, 3 requests); RSS after load host "
        f"{trocr_host.ready.rss_bytes / 2**20:.0f} MiB vs direct {direct['rss_bytes'] / 2**20:.0f}"
        f" MiB, peak host {probe.memory.rss_peak.bytes / 2**20:.0f} MiB vs direct "
        f"{direct['rss_peak_bytes'] / 2**20:.0f} MiB; one PNG text line host "
        f"{statistics.median(timings) * 1000:.1f} ms vs direct "
        f"{statistics.median(direct['request_seconds']) * 1000:.1f} ms (median of "
        f"{TIMED_REQUESTS})"
    )


async def test_the_probe_check_passes_with_measured_memory_and_the_sandbox_holds(
    trocr_host: ModelHost,
) -> None:
    ready = trocr_host.ready
    assert ready.dim == 0  # it reads text; it embeds nothing
    assert ready.runtime_versions["torchvision"] and ready.runtime_versions["pillow"]
    assert ready.runtime_versions["torch"].startswith("2.14.")  # the vision environment's torch
    # The second interpreter is sandboxed like the first: the kernel's best, whatever it is.
    assert ready.isolation == kernel_isolation(), ready.isolation_reason
    probe = await trocr_host.probe_check(timeout_s=60)
    assert probe.health.model.status == wg.HEALTH_STATUS_OK, probe.health.model.detail
    assert "generated ids, all in the vocabulary" in probe.health.model.detail
    # The encoder's states for the rendered line: one sequence, 4x4 patches and the CLS token.
    assert list(probe.output_shape) == [1, 17, 16] and probe.output_finite
    # The memory is read after the worst case: the batch size's images, each decoded to the
    # generation config's bound (forced past any end token), after the decoder's start token.
    worst = probe.worst_case
    assert worst.ran and worst.batch_inputs == 32, worst
    assert worst.generated_tokens > 0 and worst.context_tokens == worst.generated_tokens + 1
    memory = probe.memory
    assert memory.rss_current.source == "/proc/self/status VmRSS"
    assert memory.rss_peak.bytes >= memory.rss_current.bytes > 0
    assert memory.cuda_peak_allocated.unavailable == "device is cpu"
    # Observed by the child: its weights read from the verified copy alone, no model code.
    assert list(probe.offline.weight_files) == ["model.safetensors"]
    assert not probe.offline.weight_files_outside_copy
    assert not probe.offline.remote_code_modules
    assert probe.offline.network_guard
    report = await trocr_host.check_model(timeout_s=60)
    assert report.model.status == wg.HEALTH_STATUS_OK


async def test_bad_images_are_refused_naming_the_field_and_the_host_keeps_serving(
    trocr_host: ModelHost, direct: dict[str, Any]
) -> None:
    png, jpeg, _ = _images(direct)
    truncated = common_pb2.Image(data=png.data[: len(png.data) // 2], media_type="image/png")
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[jpeg, truncated]))
    assert error.metadata["field"] == "images[1]"
    junk = common_pb2.Image(data=b"definitely not an image", media_type="image/jpeg")
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[junk]))
    assert error.metadata["field"] == "images[0]"
    mislabelled = common_pb2.Image(data=png.data, media_type="image/webp")
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[mislabelled]))
    assert error.metadata["field"] == "images[0].media_type"
    unsupported = common_pb2.Image(data=png.data, media_type="image/gif")
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[unsupported]))
    assert error.metadata["field"] == "images[0].media_type"
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[]))
    assert error.metadata["field"] == "images"

    # 160 x 40 = 6,400 pixels against a limit of 6,399; and a 100,000 x 100,000 bomb.
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[png], max_image_pixels=6399))
    assert error.metadata == {
        "field": "images[0]",
        "setting": "max_image_pixels",
        "limit": "6399",
        "value": "6400",
    }
    bomb = common_pb2.Image(data=_png_claiming(100_000, 100_000), media_type="image/png")
    error = await _refusal(trocr_host, wg.RecognizeTextPayload(images=[png, bomb]))
    assert error.metadata["field"] == "images[1]" and error.metadata["value"] == str(10**10)

    # Kinds a TrOCR host does not serve are refused by kind, naming the adapter.
    with pytest.raises(GantryError) as caught:
        await trocr_host.embed_image(
            wg.EmbedImagePayload(images=[png]), trace_context={}, timeout_s=60
        )
    assert caught.value.reason == "INVALID_PAYLOAD"
    assert caught.value.metadata["adapter"] == "transformers_trocr"
    assert "cannot answer embed_image requests" in caught.value.message
    with pytest.raises(GantryError) as caught:
        await trocr_host.embed(["hello"], trace_context={}, timeout_s=60)
    assert caught.value.reason == "INVALID_PAYLOAD"

    assert trocr_host.alive
    served = await trocr_host.recognize_text(
        wg.RecognizeTextPayload(images=[png]), trace_context={}, timeout_s=60
    )
    assert list(served.texts) == direct["texts"][:1]


async def test_a_profile_whose_preprocessing_disagrees_with_the_artifact_is_refused_at_load(
    tiny_trocr_dir: Path, vision_python: str
) -> None:
    with pytest.raises(GantryError) as caught:
        await ModelHost.start(
            _spec(tiny_trocr_dir, vision_python, image_size=384, image_std=[0.25, 0.25, 0.25])
        )
    error = caught.value
    assert error.reason == "RUNTIME_INCOMPATIBLE"
    assert error.failure_class is FailureClass.CONFIG
    assert error.metadata["field"] == "adapter.image_size,adapter.image_std"
    assert "image_size is 32 in the artifact, 384 in the deployment's settings" in error.message
