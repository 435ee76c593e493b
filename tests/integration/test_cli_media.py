"""`gantry transcribe` against the real in-process control plane and scheduler (on SQLite), a
real worker and model host serving the tiny Whisper walked through every gate: a 65 s WAV goes
window by window (three Transcribe calls, a summary on stderr) and its merged transcript equals
one whole-clip Transcribe of the same file (text, language, every segment's times); the installed
entry point in a child process prints the text, refuses an image as a usage error (exit 2) and
prints the host's refusal of an unknown language (exit 1).

One Gantry with the Whisper walked to READY serves the whole module (`speech`); the tests only
transcribe and are refused, so neither changes what the other reads.

The image commands (ocr, embed-image, classify) against the tiny TrOCR and SigLIP2 need the vision
environment's worker; their integration tests are the lead's to add beside these."""

from __future__ import annotations

import asyncio
import io
import json
import math
import struct
import sys
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from gantry.cli.main import main as gantry_cli
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry

GANTRY = Path(sys.executable).with_name("gantry")  # the installed entry point
CAPABILITY = "speech"
RATE = 16_000

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's Gantry lives in its loop


def tone_wav(seconds: float) -> bytes:
    """16 kHz mono 16-bit: a different pitch in each 30 s window, so each window is heard anew."""
    frames = bytearray()
    for index in range(round(seconds * RATE)):
        frequency = 440.0 * 1.25 ** (index // (30 * RATE))
        frames += struct.pack("<h", round(12000 * math.sin(2 * math.pi * frequency * index / RATE)))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(RATE)
        writer.writeframes(bytes(frames))
    return buffer.getvalue()


@dataclass
class Speech:
    harness: Harness
    argv: list[str]  # the global options a client's `gantry` takes


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def speech(
    tmp_path_factory: pytest.TempPathFactory, tiny_whisper_dir: Path
) -> AsyncIterator[Speech]:
    """SQLite only: the CLI never touches the database, and what these tests check (the windows
    it cuts, the merged transcript, its output and exit codes) is the same whichever store the
    control plane keeps. The Transcribe RPC path on PostgreSQL is test_transcribe_rpc's."""
    directory = tmp_path_factory.mktemp("cli-media")
    root = directory / "artifacts"
    root.mkdir()
    database_url = f"sqlite+aiosqlite:///{directory / 'gantry.db'}"
    async with running_gantry(database_url, root) as harness:
        await harness.start_worker(await harness.register_node("speech-node"))
        artifact = await harness.register_model(tiny_whisper_dir, "whisper-tiny")
        deployment = await harness.deploy(
            artifact.artifact_set_id, CAPABILITY, adapter="transformers_whisper", device="cpu"
        )
        await harness.wait_deployment(
            deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=120
        )
        state = directory / "state"
        state.mkdir()
        (state / "client.key").write_text(harness.api_key + "\n")
        yield Speech(harness, ["--address", harness.address, "--state-dir", str(state)])


async def whole_clip(
    harness: Harness, data: bytes, *, timestamps: bool = True
) -> inf.TranscribeResponse:
    """One Transcribe of the whole clip: the server cuts the windows itself."""
    response: inf.TranscribeResponse = await harness.inference.Transcribe(
        inf.TranscribeRequest(
            capability=CAPABILITY,
            audio=common_pb2.Audio(data=data, media_type="audio/wav"),
            timestamps=timestamps,
        ),
        metadata=harness.client_md,
        timeout=120,
    )
    return response


def segments_of(document: dict[str, object]) -> list[tuple[float, float, str]]:
    return [
        (round(s["start_s"], 6), round(s["end_s"], 6), s["text"])  # type: ignore[index]
        for s in document["segments"]  # type: ignore[attr-defined]
    ]


async def test_a_65_s_wav_transcribed_window_by_window_equals_one_whole_clip_call(
    speech: Speech, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = tmp_path / "long.wav"
    clip.write_bytes(tone_wav(65.0))
    argv = [*speech.argv, "transcribe", str(clip), "--capability", CAPABILITY, "--timestamps"]
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    assert await asyncio.to_thread(gantry_cli, [*argv, "-o", "json"]) == 0
    captured = capsys.readouterr()
    windowed = json.loads(captured.out)
    assert [(call["start_s"], call["end_s"]) for call in windowed["calls"]] == [
        (0.0, 30.0),
        (30.0, 60.0),
        (60.0, 65.0),
    ]
    assert captured.err.startswith(f"transcribing {clip}: 65.0 s of audio in 3 windows, ")

    whole = await whole_clip(speech.harness, clip.read_bytes())
    assert windowed["text"] == whole.text
    assert windowed["language"] == whole.language
    assert windowed["audio_seconds"] == pytest.approx(whole.audio_seconds)
    expected = [(round(s.start_s, 6), round(s.end_s, 6), s.text) for s in whole.segments]
    assert segments_of(windowed) == expected
    assert all(0.0 <= start <= end <= 65.0 for start, end, _ in expected)

    # --whole: the CLI sends the file as it is, one call, and prints the same transcript.
    assert await asyncio.to_thread(gantry_cli, [*argv, "--whole", "-o", "json"]) == 0
    captured = capsys.readouterr()
    sent_whole = json.loads(captured.out)
    assert len(sent_whole["calls"]) == 1
    assert (sent_whole["text"], segments_of(sent_whole)) == (whole.text, expected)
    assert captured.err.startswith(f"transcribing {clip}: 65.0 s of audio sent whole, ")


async def test_the_installed_cli_prints_a_transcript_and_refuses_in_one_line(
    speech: Speech, tmp_path: Path
) -> None:
    clip, image = tmp_path / "tone.wav", tmp_path / "text.png"
    clip.write_bytes(tone_wav(2.0))
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32)

    async def gantry(*argv: str) -> tuple[int, str, str]:
        child = await asyncio.create_subprocess_exec(
            str(GANTRY),
            *speech.argv,
            "transcribe",
            *argv,
            "--capability",
            CAPABILITY,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=120)
        assert child.returncode is not None
        return child.returncode, out.decode(), err.decode()

    status, out, err = await gantry(str(clip))
    # Asked without timestamps, as the CLI asks unless --timestamps (they change the decoding).
    whole = await whole_clip(speech.harness, clip.read_bytes(), timestamps=False)
    assert (status, out, err) == (0, whole.text + "\n", "")  # a short clip: no progress at all

    status, out, err = await gantry(str(image))
    assert (status, out) == (2, "")
    assert err == (
        f"error: {image} is image/png; gantry transcribe reads audio (audio/wav, audio/flac, "
        "audio/pcm)\n"
    )

    status, out, err = await gantry(str(clip), "--language", "xx")
    assert (status, out) == (1, "")
    assert err.startswith("error: INVALID_ARGUMENT INVALID_PAYLOAD: ")
    assert "'xx'" in err and err.count("\n") == 1
