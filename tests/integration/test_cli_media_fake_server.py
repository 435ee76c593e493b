"""`gantry ocr`, `embed-image`, `classify` and `transcribe` against a fake Inference server (a
FakeMediaInference servicer) over real gRPC: images batched across calls in order, a refused call
named with the files it held, a long WAV or PCM clip sent window by window with its segment times
moved to the clip's start, a long FLAC sent whole, and the table and JSON output.

What the commands decide before any call is tested in tests/unit/test_cli_media.py; these serve
gRPC on a port, which the unit guard refuses.
"""

from __future__ import annotations

import io
import json
import struct
import threading
import wave
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gantry.cli.main import main
from gantry.common.inference_limits import MAX_IMAGES
from gantry.v1 import inference_pb2, inference_pb2_grpc
from tests.unit.test_cli_media import CLIENT_KEY, JPEG, PNG, WEBP, Terminal, flac_header, wav_bytes
from tests.unit.test_cli_progress import terminal_frames


@dataclass
class FakeMediaInference(inference_pb2_grpc.InferenceServicer):
    """Answers from the request alone; records every request and its deadline."""

    requests: list[Any] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)
    refuse_call: int | None = None  # the 1-based call to refuse with INVALID_PAYLOAD
    release: threading.Event | None = None  # Transcribe waits for it when set

    def _record(self, request: Any, context: grpc.ServicerContext) -> None:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {CLIENT_KEY}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "client key required")
        self.requests.append(request)
        self.deadlines.append(context.time_remaining() or 0.0)
        if self.refuse_call == len(self.requests):
            info = error_details_pb2.ErrorInfo(
                reason="INVALID_PAYLOAD", domain="gantry.dev", metadata={"field": "images[1]"}
            )
            detail = any_pb2.Any()
            detail.Pack(info)
            context.abort_with_status(
                rpc_status.to_status(
                    status_pb2.Status(
                        code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        message="images[1] is not a PNG the model host can decode",
                        details=[detail],
                    )
                )
            )

    def RecognizeText(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(request, context)
        texts = [f"text of {len(image.data)} bytes\tand a tab" for image in request.images]
        return inference_pb2.RecognizeTextResponse(
            texts=texts, deployment_id="dep-ocr", node_id=f"node-{len(self.requests)}"
        )

    def EmbedImage(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(request, context)
        vectors = [
            inference_pb2.Vector(values=[len(image.data), 0.5, -0.25] + [0.0] * 7)
            for image in request.images
        ]
        return inference_pb2.EmbedResponse(
            vectors=vectors, dim=10, deployment_id="dep-img", node_id="node-1"
        )

    def ClassifyImage(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(request, context)
        scores = sorted(
            ((1.0 / (index + 2), index, label) for index, label in enumerate(request.labels)),
            reverse=True,
        )[: request.top_k or None]
        results = [
            inference_pb2.ImageClassification(
                labels=[
                    inference_pb2.LabelScore(label=label, index=index, score=score)
                    for score, index, label in scores
                ]
            )
            for _ in request.images
        ]
        return inference_pb2.ClassifyImageResponse(
            results=results, deployment_id="dep-cls", node_id="node-1"
        )

    def Transcribe(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(request, context)
        if self.release is not None:
            self.release.wait(timeout=30)
        audio = request.audio
        if audio.media_type == "audio/wav":
            with wave.open(io.BytesIO(audio.data), "rb") as reader:
                seconds = reader.getnframes() / reader.getframerate()
                first = struct.unpack("<h", reader.readframes(1))[0]
        elif audio.media_type == "audio/pcm":
            seconds = len(audio.data) / (2 * audio.channels * audio.sample_rate_hz)
            first = struct.unpack("<h", audio.data[:2])[0]
        else:
            seconds, first = 95.0, -1
        response = inference_pb2.TranscribeResponse(
            text=f"from sample {first}",
            language=request.language or "fr",
            audio_seconds=seconds,
            deployment_id="dep-asr",
            node_id="node-1",
        )
        if request.timestamps:
            response.segments.add(start_s=0.0, end_s=min(seconds, 1.5), text=f" s{first}")
        return response


@dataclass
class Served:
    fake: FakeMediaInference
    argv: list[str]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    fake = FakeMediaInference()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    state = tmp_path / "state"
    state.mkdir()
    (state / "client.key").write_text(CLIENT_KEY + "\n")
    try:
        yield Served(fake, ["--address", f"127.0.0.1:{port}", "--state-dir", str(state)])
    finally:
        server.stop(None)


def _images(tmp_path: Path, count: int) -> list[str]:
    kinds = (PNG, JPEG, WEBP)
    paths = []
    for index in range(count):
        path = tmp_path / f"img-{index:03d}.bin"
        path.write_bytes(kinds[index % 3] + b"\x00" * index)  # its size says which it is
        paths.append(str(path))
    return paths


def test_ocr_prints_one_line_per_file_in_order_across_calls(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _images(tmp_path, MAX_IMAGES + 4)
    assert main([*served.argv, "ocr", *paths, "--capability", "ocr"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 32 header bytes + index padding; a tab in the text becomes a space: one column per field.
    assert lines == [
        f"{path}\ttext of {32 + index} bytes and a tab" for index, path in enumerate(paths)
    ]
    counts = [len(request.images) for request in served.fake.requests]
    assert counts == [MAX_IMAGES, 4]  # the control plane's default bound on one call
    first = served.fake.requests[0]
    assert (first.capability, [i.media_type for i in first.images[:3]]) == (
        "ocr",
        ["image/png", "image/jpeg", "image/webp"],
    )

    assert main([*served.argv, "ocr", *paths[:2], "--deployment-id", "dep-ocr", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert served.fake.requests[-1].deployment_id == "dep-ocr"
    assert document["results"] == [
        {"file": paths[0], "media_type": "image/png", "text": "text of 32 bytes\tand a tab"},
        {"file": paths[1], "media_type": "image/jpeg", "text": "text of 33 bytes\tand a tab"},
    ]
    assert document["calls"] == [{"deployment_id": "dep-ocr", "node_id": "node-3", "images": 2}]


def test_a_refused_call_prints_the_servers_error_and_which_files_it_held(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served.fake.refuse_call = 2
    paths = _images(tmp_path, MAX_IMAGES + 2)
    last = MAX_IMAGES + 1
    assert main([*served.argv, "ocr", *paths, "--capability", "ocr"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"note: call 2 of 2 failed; it held files {MAX_IMAGES}..{last} ({paths[MAX_IMAGES]} .. "
        f"{paths[last]}), so images[i] in the error is file {MAX_IMAGES}+i",
        "error: INVALID_ARGUMENT INVALID_PAYLOAD: images[1] is not a PNG the model host can decode",
    ]


def test_embed_image_prints_vectors_as_gantry_embed_does(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _images(tmp_path, 2)
    assert main([*served.argv, "embed-image", *paths, "--capability", "siglip"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "2 vector(s), dim 10, deployment dep-img",
        f"[0] {paths[0]!r}: [+32.0000, +0.5000, -0.2500, +0.0000, +0.0000, +0.0000, +0.0000, "
        "+0.0000, …]",
        f"[1] {paths[1]!r}: [+33.0000, +0.5000, -0.2500, +0.0000, +0.0000, +0.0000, +0.0000, "
        "+0.0000, …]",
    ]
    assert main([*served.argv, "embed-image", *paths, "--capability", "siglip", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dim"] == 10 and document["files"] == paths
    assert document["vectors"][1][:3] == [33.0, 0.5, -0.25]
    assert document["calls"] == [{"deployment_id": "dep-img", "node_id": "node-1", "vectors": 2}]


def test_classify_sends_the_labels_in_order_and_prints_each_images_scores(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _images(tmp_path, 2)
    labels = ["a cat, sitting", "a dog", "a bird"]
    argv = [*served.argv, "classify", *paths, "--capability", "siglip", "--labels", *labels]
    assert main([*argv, "--top-k", "2"]) == 0
    request = served.fake.requests[-1]
    assert (list(request.labels), request.top_k) == (labels, 2)
    assert capsys.readouterr().out.splitlines() == [
        f"{'FILE'.ljust(len(paths[0]))}  LABEL           SCORE",
        f"{paths[0]}  a cat, sitting  0.5000",
        f"{' ' * len(paths[0])}  a dog           0.3333",
        f"{paths[1]}  a cat, sitting  0.5000",
        f"{' ' * len(paths[0])}  a dog           0.3333",
    ]
    assert main([*argv, "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"][1] == {
        "file": paths[1],
        "labels": [
            {"label": "a cat, sitting", "index": 0, "score": 0.5},
            {"label": "a dog", "index": 1, "score": 0.333333343},
            {"label": "a bird", "index": 2, "score": 0.25},
        ],
    }


def test_a_long_wav_goes_window_by_window_with_times_from_the_clips_start(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = tmp_path / "long.wav"
    clip.write_bytes(wav_bytes(95 * 16_000))
    argv = [*served.argv, "transcribe", str(clip), "--capability", "speech", "--timestamps"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    # Sample n holds n mod 30000, so each window's first sample says where it was cut.
    starts = [(30 * 16_000 * k) % 30_000 for k in range(4)]
    assert captured.out.splitlines() == [
        " ".join(f"from sample {start}" for start in starts),
        f"[   0.00 -    1.50] s{starts[0]}",
        f"[  30.00 -   31.50] s{starts[1]}",
        f"[  60.00 -   61.50] s{starts[2]}",
        f"[  90.00 -   91.50] s{starts[3]}",
    ]
    # stderr is no terminal here: no redraws, only the summary.
    assert (
        captured.err.startswith(f"transcribing {clip}: 95.0 s of audio in 4 windows, ")
        and captured.err.count("\n") == 1
    )
    requests = served.fake.requests
    assert [r.audio.media_type for r in requests] == ["audio/wav"] * 4
    # No --language: the first window's detected language is asked of the others.
    assert [r.language for r in requests] == ["", "fr", "fr", "fr"]
    assert all(r.timestamps and r.capability == "speech" for r in requests)

    assert main([*argv, "--language", "en", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["language"], document["audio_seconds"]) == ("en", 95.0)
    assert [s["start_s"] for s in document["segments"]] == [0.0, 30.0, 60.0, 90.0]
    assert [(c["start_s"], c["end_s"]) for c in document["calls"]] == [
        (0.0, 30.0),
        (30.0, 60.0),
        (60.0, 90.0),
        (90.0, 95.0),
    ]
    assert [r.language for r in requests[4:]] == ["en"] * 4


def test_a_short_clip_or_whole_goes_in_one_call_with_its_own_bytes(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short, long = tmp_path / "short.wav", tmp_path / "long.wav"
    short.write_bytes(wav_bytes(16_000 * 2))
    long.write_bytes(wav_bytes(16_000 * 65))
    base = [*served.argv, "transcribe", "--capability", "speech"]
    assert main([*base, str(short)]) == 0
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("from sample 0\n", "")
    assert main([*base, str(long), "--whole", "--timeout", "10"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(f"transcribing {long}: 65.0 s of audio sent whole, ")
    assert [r.audio.data for r in served.fake.requests] == [short.read_bytes(), long.read_bytes()]
    # Sent whole, the deadline is the per-call timeout for each of its three windows. gRPC's
    # timeout header rounds a deadline past 100 s up to whole seconds (CI saw 120.9986 s).
    assert served.fake.deadlines[0] <= 121 and 20 < served.fake.deadlines[1] <= 30


def test_raw_pcm_is_windowed_with_its_rate_and_channels(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "clip.raw"
    raw.write_bytes(b"".join(struct.pack("<hh", n % 30_000, 0) for n in range(8_000 * 40)))
    argv = [*served.argv, "transcribe", str(raw), "--deployment-id", "dep-asr"]
    pcm = ["--media-type", "audio/pcm", "--sample-rate", "8000", "--channels", "2"]
    assert main([*argv, *pcm, "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["text"] == f"from sample 0 from sample {240_000 % 30_000}"
    audio = [r.audio for r in served.fake.requests]
    assert [(a.media_type, a.sample_rate_hz, a.channels) for a in audio] == [
        ("audio/pcm", 8_000, 2)
    ] * 2
    assert [len(a.data) for a in audio] == [30 * 8_000 * 4, 10 * 8_000 * 4]
    assert all(r.deployment_id == "dep-asr" for r in served.fake.requests)


def test_a_long_flac_is_sent_whole_with_a_spinner_on_a_terminal(
    served: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    flac = tmp_path / "long.flac"
    flac.write_bytes(flac_header(rate=16_000, total_samples=95 * 16_000) + b"\x00" * 64)
    release = threading.Event()
    served.fake.release = release

    class SpinnerWatch(Terminal):
        def write(self, text: str) -> int:
            if "(sent whole)" in text:
                release.set()  # the spinner has turned while the call ran: let it answer
            return super().write(text)

    terminal = SpinnerWatch()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setenv("COLUMNS", "1000")  # wide enough for the whole line (tmp_path is long)
    assert main([*served.argv, "transcribe", str(flac), "--capability", "speech"]) == 0
    assert capsys.readouterr().out == "from sample -1\n"
    [request] = served.fake.requests
    assert request.audio.media_type == "audio/flac" and request.audio.data == flac.read_bytes()
    # 4 windows x the 120 s default; gRPC's timeout header rounds up to whole seconds.
    assert 360 < served.fake.deadlines[0] <= 481
    drawn = terminal_frames(terminal.getvalue())
    assert drawn[0].startswith(f"transcribing {flac}: | ") and "(sent whole)" in drawn[0]
    assert drawn[-1].startswith(f"transcribing {flac}: 95.0 s of audio sent whole, ")
