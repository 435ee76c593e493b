"""Inference.Transcribe end to end: a tiny Whisper walked through every gate to READY, then served
over gRPC (control plane -> scheduler -> worker -> model host) on SQLite and PostgreSQL.

The transcript of a generated tone is the one transformers gives directly on the same samples,
whether the clip is sent as WAV, raw PCM or FLAC, and with timestamps its segments are too. Bad
clips get typed refusals naming the field (and the setting and limit past a limit) before anything
is scheduled; a language the model lacks is the host's refusal; an image RPC sent to the Whisper
deployment is the host's typed refusal, and none of these moves the deployment off READY. A
Transcribe sent to an embedding deployment is INVALID_PAYLOAD from its host. An operator's grpcurl
with the clip base64 in JSON, as the README shows, gets the same text.

One Gantry per database serves the module (`gantry`): its worker takes the Whisper (`whisper`) and
the embedder (`embedder`), each walked to READY once, when a test first asks for it. Every test
only calls and is refused, so none moves state another test reads; each checks, after its
refusals, that its own deployment is still READY.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import wave
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio

from gantry.common.inference_limits import InferenceLimits
from gantry.common.status import error_info_of
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry
from tests.integration.module_databases import MODULE_DATABASES, module_database
from tests.integration.test_model_host_whisper import Direct

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
RATE = 16_000
READY = cp.DEPLOYMENT_STATE_READY
# Lowered so the oversize clips stay small: 20 s and 1 MB per clip (a 20 s WAV is 640 KB).
LIMITS = InferenceLimits(max_audio_seconds=20, max_audio_bytes=1_000_000)

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's Gantry lives in its loop


def _tone(seconds: float, *, seed: int = 7) -> np.ndarray:
    """Deterministic int16 audio: a 440 Hz tone under a little noise."""
    times = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(seed).standard_normal(len(times)) * 0.05
    return ((0.5 * np.sin(2 * np.pi * 440 * times) + noise) * 16_000).astype("<i2")


def _wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(samples.tobytes())
    return buffer.getvalue()


def _flac(samples: np.ndarray) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples.reshape(-1, 1), RATE, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def _request(audio: common_pb2.Audio | None, **fields: Any) -> inf.TranscribeRequest:
    request = inf.TranscribeRequest(capability=fields.pop("capability", "speech"), **fields)
    if audio is not None:
        request.audio.CopyFrom(audio)
    return request


async def _refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    return caught.value.code(), info.reason, dict(info.metadata)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=MODULE_DATABASES)
async def gantry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    """One Gantry per database, with the lowered limits, and the one worker every deployment of
    the module is placed on."""
    directory = tmp_path_factory.mktemp(f"transcribe-{request.param}")
    root = directory / "artifacts"
    root.mkdir()
    async with (
        module_database(request.param, directory) as database_url,
        running_gantry(database_url, root, inference=InferenceSettings(limits=LIMITS)) as harness,
    ):
        await harness.start_worker(await harness.register_node("speech-node"))
        yield harness


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def whisper(gantry: Harness, tiny_whisper_dir: Path) -> cp.Deployment:
    """The tiny Whisper through every gate to READY as capability "speech"."""
    artifact = await gantry.register_model(tiny_whisper_dir, "whisper-tiny")
    created = await gantry.deploy(
        artifact.artifact_set_id,
        "speech",
        adapter="transformers_whisper",
        device="cpu",
        language="en",
        task="transcribe",
    )
    return await gantry.wait_deployment(created.deployment_id, READY, timeout=180)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def embedder(gantry: Harness, tiny_model_dir: Path) -> cp.Deployment:
    """The tiny sentence embedder through every gate to READY as capability "embed"."""
    artifact = await gantry.register_model(tiny_model_dir, "tiny-embedder")
    created = await gantry.deploy(artifact.artifact_set_id, "embed")
    return await gantry.wait_deployment(created.deployment_id, READY, timeout=120)


@dataclass(frozen=True)
class Transcripts:
    """What transformers alone makes of the 3 s tone, with and without timestamps."""

    samples: np.ndarray
    text: str
    segments: list[Any]
    plain_text: str


@pytest.fixture(scope="module")
def direct(tiny_whisper_dir: Path) -> Transcripts:
    """Run once for both databases: the model and the tone are the same."""
    samples = _tone(3.0)
    model = Direct(tiny_whisper_dir)
    text, segments = model.run(samples, timestamps=True)
    plain_text, _ = model.run(samples, timestamps=False)
    return Transcripts(samples=samples, text=text, segments=segments, plain_text=plain_text)


def _grpcurl(harness: Harness, method: str, body: dict[str, Any]) -> dict[str, Any]:
    completed = subprocess.run(
        [
            str(GRPCURL),
            "-plaintext",
            "-H",
            f"authorization: Bearer {harness.api_key}",
            "-d",
            "@",
            harness.address,
            method,
        ],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    answer: dict[str, Any] = json.loads(completed.stdout)
    return answer


async def test_transcribe_serves_wav_pcm_and_flac_as_transformers_does_and_refuses_bad_clips(
    gantry: Harness, whisper: cp.Deployment, direct: Transcripts
) -> None:
    harness, ready = gantry, whisper
    client, rpc = harness.client_md, harness.inference.Transcribe
    samples, text, segments = direct.samples, direct.text, direct.segments
    plain_text = direct.plain_text
    assert plain_text  # the random model says something

    clips = {
        "wav": common_pb2.Audio(data=_wav(samples), media_type="audio/wav"),
        "pcm": common_pb2.Audio(
            data=samples.tobytes(), media_type="audio/pcm", sample_rate_hz=RATE, channels=1
        ),
        "flac": common_pb2.Audio(data=_flac(samples), media_type="audio/flac"),
    }
    for kind, audio in clips.items():
        served = await rpc(_request(audio), metadata=client)
        assert (served.text, served.language, served.audio_seconds) == (
            plain_text,
            "en",
            3.0,
        ), kind
        assert list(served.segments) == [], kind  # no timestamps asked
        assert served.deployment_id == ready.deployment_id and served.node_id
    timed = await rpc(_request(clips["wav"], timestamps=True), metadata=client)
    assert timed.text == text
    assert [s.text for s in timed.segments] == [t for _, _, t in segments]
    served_times = [moment for s in timed.segments for moment in (s.start_s, s.end_s)]
    assert served_times == pytest.approx([m for b, e, _ in segments for m in (b, e)])

    # Refused by the control plane, by name, before anything is scheduled.
    refusals = [
        (_request(None), "INVALID_ARGUMENT", {"field": "audio"}),
        (
            _request(common_pb2.Audio(data=b"RIFF....WAVEjunk", media_type="audio/wav")),
            "INVALID_PAYLOAD",
            {"field": "audio"},
        ),
        (
            _request(common_pb2.Audio(data=_wav(samples), media_type="audio/mpeg")),
            "INVALID_PAYLOAD",
            {"field": "audio.media_type"},
        ),
        (
            _request(common_pb2.Audio(data=_flac(samples), media_type="audio/wav")),
            "INVALID_PAYLOAD",
            {"field": "audio.media_type"},
        ),
        (
            _request(common_pb2.Audio(data=samples.tobytes(), media_type="audio/pcm")),
            "INVALID_PAYLOAD",
            {"field": "audio.sample_rate_hz"},
        ),
        (
            _request(common_pb2.Audio(data=_wav(_tone(32.0)), media_type="audio/wav")),
            "INVALID_PAYLOAD",
            {
                "field": "audio",
                "setting": "max_audio_bytes",
                "limit": "1000000",
                "value": str(len(_wav(_tone(32.0)))),
            },
        ),
        (  # 25 s at 8 kHz: 400 KB, within the bytes, past the seconds
            _request(
                common_pb2.Audio(data=_wav(_tone(50.0)[::4], rate=8_000), media_type="audio/wav")
            ),
            "INVALID_PAYLOAD",
            {"field": "audio", "setting": "max_audio_seconds", "limit": "20"},
        ),
    ]
    for request, reason, metadata in refusals:
        code, got, details = await _refused(rpc(request, metadata=client))
        assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, reason), details
        assert {key: details.get(key) for key in metadata} == metadata

    # Refused by the model host, through the whole path, as the client's error.
    code, reason, details = await _refused(
        rpc(_request(clips["pcm"], language="xx"), metadata=client)
    )
    assert (code, reason, details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAYLOAD",
        "language",
    )
    image = common_pb2.Image(data=_png(), media_type="image/png")
    for call in (
        harness.inference.RecognizeText(
            inf.RecognizeTextRequest(capability="speech", images=[image]), metadata=client
        ),
        harness.inference.EmbedImage(
            inf.EmbedImageRequest(capability="speech", images=[image]), metadata=client
        ),
        harness.inference.ClassifyImage(
            inf.ClassifyImageRequest(capability="speech", images=[image], labels=["a tone"]),
            metadata=client,
        ),
    ):
        code, reason, _ = await _refused(call)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")

    still = await harness.deployment(ready.deployment_id)
    assert still.state == READY
    assert [r.residency_id for r in still.residencies] == [
        r.residency_id for r in ready.residencies
    ]

    if GRPCURL.exists():  # the operator's path, as the README shows it
        body = {
            "capability": "speech",
            "audio": {
                "data": base64.b64encode(_wav(samples)).decode(),
                "mediaType": "audio/wav",
            },
        }
        answer = await asyncio.to_thread(_grpcurl, harness, "gantry.v1.Inference/Transcribe", body)
        assert answer["text"] == plain_text
        assert answer.get("audioSeconds", answer.get("audio_seconds")) == 3


async def test_transcribe_sent_to_an_embedding_deployment_is_the_hosts_invalid_payload(
    gantry: Harness, embedder: cp.Deployment
) -> None:
    harness, ready = gantry, embedder
    audio = common_pb2.Audio(data=_wav(_tone(1.0)), media_type="audio/wav")
    for _ in range(3):  # repeated: a refusal is not a fault the breakers count
        code, reason, _details = await _refused(
            harness.inference.Transcribe(
                _request(audio, capability="embed"), metadata=harness.client_md
            )
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
    embedded = await harness.inference.Embed(
        inf.EmbedRequest(capability="embed", inputs=["still serving"]),
        metadata=harness.client_md,
    )
    assert len(embedded.vectors) == 1
    assert (await harness.deployment(ready.deployment_id)).state == READY


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def _kserve_transcribe(clip: bytes, **extra: bytes) -> Any:
    from gantry.kserve import grpc_service_pb2 as kserve

    request = kserve.ModelInferRequest(model_name="speech")
    for name, data in (("audio", clip), *extra.items()):
        request.inputs.add(
            name=name,
            datatype="BYTES",
            shape=[1],
            contents=kserve.InferTensorContents(bytes_contents=[data]),
        )
    return request


async def test_the_open_inference_protocol_transcribes_like_transcribe(
    gantry: Harness, whisper: cp.Deployment, direct: Transcripts
) -> None:
    # ModelInfer on the Whisper capability: an `audio` BYTES [1] tensor (WAV or FLAC, the type
    # read from the bytes), a `text` BYTES [1] answer equal to gantry.v1 Transcribe's.
    from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc

    stub = kserve_grpc.GRPCInferenceServiceStub(gantry.channel)
    for clip in (_wav(direct.samples), _flac(direct.samples)):
        answered = await stub.ModelInfer(
            _kserve_transcribe(clip, language=b"en"), metadata=gantry.client_md
        )
        assert [(o.name, o.datatype, list(o.shape)) for o in answered.outputs] == [
            ("text", "BYTES", [1])
        ]
        # Triton's wire form: a BYTES output in raw_output_contents, each element a 4-byte
        # little-endian length and its bytes.
        (raw,) = answered.raw_output_contents
        length = int.from_bytes(raw[:4], "little")
        assert len(raw) == 4 + length
        assert raw[4:].decode() == direct.plain_text
    code, reason, details = await _refused(
        stub.ModelInfer(_kserve_transcribe(b"not audio at all"), metadata=gantry.client_md)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.get("field") == "audio", (
        reason,
        details,
    )
