"""`gantry ocr`, `embed-image`, `classify` and `transcribe`: media types from magic bytes, files
that cannot be sent refused in one line (exit 2) before any call, images batched inside the per-call
bounds, a long WAV or PCM clip cut into 30 s windows whose segment times are moved to the clip's
start, progress on stderr, and the table and JSON output; the commands run against a fake
Inference server (a FakeMediaInference servicer) over real gRPC."""

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

from gantry.cli.main import build_parser, main
from gantry.cli.media_files import (
    ClipWindow,
    MediaFileError,
    PcmClip,
    clip_windows,
    flac_seconds,
    merged_transcript,
    pcm_clip,
    read_media_file,
    sniff_media_type,
    split_image_calls,
    wav_clip,
    window_audio,
    window_count,
)
from gantry.cli.media_progress import TranscribeProgress, window_label
from gantry.common.inference_limits import MAX_IMAGES
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc

CLIENT_KEY = "key_media_secret"
UNREACHABLE = "127.0.0.1:1"  # cases that must end before any call
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 28
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16


def wav_bytes(frames: int, *, rate: int = 16_000, channels: int = 1) -> bytes:
    """A 16-bit WAV whose sample n (of every channel) is n mod 30000: a window shows its start."""
    samples = b"".join(struct.pack("<h", index % 30_000) * channels for index in range(frames))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(samples)
    return buffer.getvalue()


def flac_header(*, rate: int, total_samples: int) -> bytes:
    """`fLaC` and a STREAMINFO block (mono, 16 bits) saying `total_samples` at `rate`."""
    packed = (rate << 44) | (0 << 41) | (15 << 36) | total_samples
    info = struct.pack(">HH", 4096, 4096) + b"\x00" * 6 + packed.to_bytes(8, "big") + b"\x00" * 16
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


# -- media types and unreadable files -------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (WEBP, "image/webp"),
        (wav_bytes(4), "audio/wav"),
        (flac_header(rate=16_000, total_samples=16_000), "audio/flac"),
        (b"RIFF\x10\x00\x00\x00AVI LIST", None),
        (b"GIF89a", None),
        (b"\x00\x01" * 8, None),
        (b"", None),
    ],
    ids=["png", "jpeg", "webp", "wav", "flac", "riff-avi", "gif", "pcm", "empty"],
)
def test_a_files_type_is_read_from_its_magic_bytes(head: bytes, expected: str | None) -> None:
    assert sniff_media_type(head[:16]) == expected


def _written(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_a_file_that_cannot_be_sent_is_named_with_why(tmp_path: Path) -> None:
    images = ("image/png", "image/jpeg", "image/webp")
    cases = {
        str(tmp_path / "missing.png"): "cannot read {}: No such file or directory",
        str(tmp_path): "cannot read {}: Is a directory",
        _written(tmp_path, "empty.png", b""): "{} is empty",
        _written(tmp_path, "tone.wav", wav_bytes(8)): (
            "{} is audio/wav; gantry ocr reads images (image/png, image/jpeg, image/webp)"
        ),
        _written(tmp_path, "anim.gif", b"GIF89a" + b"\x00" * 20): (
            "cannot tell the media type of {} from its first bytes (not PNG, JPEG or WebP; "
            "name its type with --media-type)"
        ),
    }
    for path, message in cases.items():
        with pytest.raises(MediaFileError) as caught:
            read_media_file(path, accepted=images, command="ocr")
        assert str(caught.value) == message.format(path)


def test_media_type_given_is_used_as_is_without_sniffing(tmp_path: Path) -> None:
    path = _written(tmp_path, "photo.bin", b"not really a jpeg")
    media = read_media_file(path, accepted=("image/png",), command="ocr", declared="image/jpeg")
    assert (media.media_type, media.data) == ("image/jpeg", b"not really a jpeg")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["ocr", "{tmp}/missing.png"],
            "error: cannot read {tmp}/missing.png: No such file or directory",
        ),
        (
            ["classify", "{tmp}/tone.wav", "--labels", "a cat"],
            "error: {tmp}/tone.wav is "
            "audio/wav; gantry classify reads images (image/png, image/jpeg, image/webp)",
        ),
        (
            ["transcribe", "{tmp}/text.png"],
            "error: {tmp}/text.png is image/png; gantry "
            "transcribe reads audio (audio/wav, audio/flac, audio/pcm)",
        ),
        (
            ["transcribe", "{tmp}/raw.pcm"],
            "error: cannot tell the media type of {tmp}/raw.pcm "
            "from its first bytes (not WAV or FLAC; name its type with --media-type, raw PCM as "
            "--media-type audio/pcm --sample-rate HZ [--channels N])",
        ),
        (
            [
                "transcribe",
                "{tmp}/raw.pcm",
                "--media-type",
                "audio/pcm",
                "--sample-rate",
                "8000",
                "--channels",
                "2",
            ],
            "error: {tmp}/raw.pcm holds 6 bytes, not a whole number of "
            "2-channel 16-bit frames (4 bytes each)",
        ),
    ],
    ids=["missing", "audio-to-classify", "image-to-transcribe", "unknown-audio", "torn-pcm"],
)
def test_an_unsendable_file_is_one_line_and_exit_2_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "tone.wav").write_bytes(wav_bytes(8))
    (tmp_path / "text.png").write_bytes(PNG)
    (tmp_path / "raw.pcm").write_bytes(b"\x01\x00" * 3)
    argv = [part.format(tmp=tmp_path) for part in argv]
    # No client key in this state directory: the file is refused before the key is even read.
    base = ["--address", UNREACHABLE, "--state-dir", str(tmp_path)]
    assert main([*base, *argv, "--capability", "media"]) == 2
    assert capsys.readouterr().err == message.format(tmp=tmp_path) + "\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ocr"], "error: one of the arguments --capability --deployment-id is required"),
        (["ocr", "--capability", "o"], "error: give at least one FILE"),
        (
            ["classify", "--capability", "c", "--labels", "a", "{tmp}/x.png"],
            "error: give at least one FILE (before --labels, or after the labels and --)",
        ),
        (
            ["classify", "{tmp}/x.png", "--capability", "c"],
            "the following arguments are required: --labels",
        ),
        (
            ["transcribe", "{tmp}/x.pcm", "--capability", "s", "--media-type", "audio/pcm"],
            "error: --media-type audio/pcm needs --sample-rate HZ",
        ),
        (
            ["transcribe", "{tmp}/x.wav", "--capability", "s", "--sample-rate", "8000"],
            "error: --sample-rate and --channels describe raw PCM: add --media-type audio/pcm",
        ),
        (
            [
                "transcribe",
                "{tmp}/x.pcm",
                "--capability",
                "s",
                "--media-type",
                "audio/pcm",
                "--sample-rate",
                "0",
            ],
            "argument --sample-rate: 0 is not above 0",
        ),
        (
            ["classify", "{tmp}/x.png", "--capability", "c", "--labels", "a", "--top-k", "-1"],
            "argument --top-k: -1 is negative",
        ),
    ],
    ids=[
        "no-target",
        "no-file",
        "labels-ate-the-file",
        "no-labels",
        "pcm-without-rate",
        "rate-without-pcm",
        "zero-rate",
        "negative-top-k",
    ],
)
def test_flag_mistakes_are_argparse_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    argv = [part.format(tmp=tmp_path) for part in argv]
    with pytest.raises(SystemExit) as caught:
        main(["--address", UNREACHABLE, "--state-dir", str(tmp_path), *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: gantry {argv[0]}" in err and expected in err


def test_labels_keep_their_commas_and_end_at_the_next_option_or_double_dash() -> None:
    parser = build_parser()
    given = ["--labels", "a cat, sitting", "a dog", "--labels", "a bird"]
    files_first = parser.parse_args(["classify", "a.png", "b.png", "--capability", "c", *given])
    files_last = parser.parse_args(
        ["classify", "--capability", "c", *given, "--", "a.png", "b.png"]
    )
    option_after = parser.parse_args(["classify", *given, "--capability", "c", "a.png", "b.png"])
    for args in (files_first, files_last, option_after):
        assert args.labels == ["a cat, sitting", "a dog", "a bird"]
        assert args.files == ["a.png", "b.png"]


# -- images batched within the bounds of one call -------------------------------------------------


def test_images_are_split_by_count_and_by_bytes_keeping_their_order() -> None:
    assert split_image_calls([1] * 40, max_images=16, max_request_bytes=100) == [
        range(0, 16),
        range(16, 32),
        range(32, 40),
    ]
    assert split_image_calls([4, 4, 2, 1], max_images=16, max_request_bytes=6) == [
        range(0, 1),
        range(1, 3),
        range(3, 4),
    ]
    # An image past the byte bound still goes, alone, for the server to refuse by its limit.
    assert split_image_calls([2, 50, 2], max_images=16, max_request_bytes=10) == [
        range(0, 1),
        range(1, 2),
        range(2, 3),
    ]
    assert split_image_calls([], max_images=16, max_request_bytes=10) == []


# -- audio windows and their times ----------------------------------------------------------------


def test_a_95_s_clip_is_four_windows_starting_every_30_s() -> None:
    clip = wav_clip(wav_bytes(95 * 16_000))
    assert clip is not None and clip.seconds == 95.0
    windows = clip_windows(clip)
    assert [(w.number, w.count, w.start_s, w.end_s) for w in windows] == [
        (1, 4, 0.0, 30.0),
        (2, 4, 30.0, 60.0),
        (3, 4, 60.0, 90.0),
        (4, 4, 90.0, 95.0),
    ]
    assert [w.frame_count for w in windows] == [480_000, 480_000, 480_000, 80_000]
    assert window_label(windows[2]) == "window 3/4 (60-90 s)"
    assert window_count(95.0) == 4 and window_count(30.0) == 1 and window_count(0.5) == 1


def test_a_clip_of_one_window_or_less_is_one_window() -> None:
    for frames in (1, 16_000, 30 * 16_000):
        clip = wav_clip(wav_bytes(frames))
        assert clip is not None
        assert len(clip_windows(clip)) == 1
    assert (
        clip_windows(PcmClip(frames=b"", sample_rate_hz=16_000, channels=1, sample_width=2)) == []
    )


def test_a_window_is_the_clips_own_frames_rewrapped_as_a_wav() -> None:
    clip = wav_clip(wav_bytes(3 * 44_100 + 7, rate=44_100, channels=2))
    assert clip is not None
    windows = clip_windows(clip, window_seconds=1.0)
    assert [w.frame_count for w in windows] == [44_100, 44_100, 44_100, 7]
    third = window_audio(clip, windows[2], media_type="audio/wav")
    assert third.media_type == "audio/wav"
    with wave.open(io.BytesIO(third.data), "rb") as reader:
        assert (reader.getnchannels(), reader.getsampwidth(), reader.getframerate()) == (
            2,
            2,
            44_100,
        )
        frames = reader.readframes(reader.getnframes())
    assert frames == clip.frames[2 * 44_100 * 4 : 3 * 44_100 * 4]
    assert struct.unpack("<hh", frames[:4]) == ((2 * 44_100) % 30_000,) * 2


def test_raw_pcm_windows_are_slices_that_keep_their_rate_and_channels() -> None:
    data = b"".join(struct.pack("<hh", n % 30_000, -(n % 30_000)) for n in range(8_000 * 65))
    clip = pcm_clip("x.pcm", data, sample_rate_hz=8_000, channels=2)
    windows = clip_windows(clip)
    assert [(w.start_s, w.end_s) for w in windows] == [(0.0, 30.0), (30.0, 60.0), (60.0, 65.0)]
    last = window_audio(clip, windows[2], media_type="audio/pcm")
    assert (last.media_type, last.sample_rate_hz, last.channels) == ("audio/pcm", 8_000, 2)
    assert last.data == data[60 * 8_000 * 4 :]


def test_a_wav_the_wave_module_cannot_read_is_sent_whole() -> None:
    float_wav = bytearray(wav_bytes(16))
    float_wav[20:22] = struct.pack("<H", 3)  # WAVE_FORMAT_IEEE_FLOAT
    assert wav_clip(bytes(float_wav)) is None
    assert wav_clip(b"RIFF\x00\x00\x00\x00WAVE") is None


def test_a_flac_says_its_length_in_its_streaminfo() -> None:
    assert flac_seconds(flac_header(rate=16_000, total_samples=95 * 16_000)) == 95.0
    assert flac_seconds(flac_header(rate=44_100, total_samples=0)) is None  # unknown
    assert flac_seconds(b"fLaC\x84" + b"\x00" * 40) is None  # first block not STREAMINFO
    assert flac_seconds(b"fLaC") is None


def test_flac_seconds_agrees_with_soundfile() -> None:
    soundfile = pytest.importorskip("soundfile")
    import numpy as np

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(16_000 * 2 + 160, dtype="int16"), 16_000, format="FLAC")
    assert flac_seconds(buffer.getvalue()) == pytest.approx(2.01)


def _window(number: int, count: int, start_s: float, end_s: float) -> ClipWindow:
    return ClipWindow(
        number=number,
        count=count,
        first_frame=round(start_s * 16_000),
        frame_count=round((end_s - start_s) * 16_000),
        start_s=start_s,
        end_s=end_s,
    )


def test_window_transcripts_merge_with_times_from_the_clips_start() -> None:
    windows = [_window(1, 3, 0.0, 30.0), _window(2, 3, 30.0, 60.0), _window(3, 3, 60.0, 65.0)]
    segment = common_pb2.TranscriptSegment
    responses = [
        inference_pb2.TranscribeResponse(
            text=" hello ",
            language="de",
            audio_seconds=30.0,
            segments=[segment(start_s=0.0, end_s=2.5, text=" hello ")],
            deployment_id="dep-1",
            node_id="node-a",
        ),
        inference_pb2.TranscribeResponse(text="  ", language="de", audio_seconds=30.0),
        inference_pb2.TranscribeResponse(
            text="world",
            language="de",
            audio_seconds=5.0,
            segments=[
                segment(start_s=0.0, end_s=1.0, text="wor"),
                segment(start_s=1.0, end_s=5.0, text="ld"),
            ],
            node_id="node-b",
        ),
    ]
    merged = merged_transcript(windows, responses)
    assert merged.text == "hello world"  # empty windows add no space
    assert (merged.language, merged.audio_seconds) == ("de", 65.0)
    assert (merged.deployment_id, merged.node_id) == ("dep-1", "node-a")
    assert [(s.start_s, s.end_s, s.text) for s in merged.segments] == [
        (0.0, 2.5, " hello "),
        (60.0, 61.0, "wor"),
        (61.0, 65.0, "ld"),
    ]
    with pytest.raises(ValueError):
        merged_transcript(windows, responses[:2])


# -- progress -------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    """A StringIO that says it is a terminal, as stderr on one does."""

    def isatty(self) -> bool:
        return True


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_each_window_redraws_the_line_then_a_summary_ends_it() -> None:
    stream, clock = Terminal(), Ticks()
    progress = TranscribeProgress("transcribing a.wav", stream=stream, clock=clock)
    for number, start in enumerate((0.0, 30.0, 60.0), start=1):
        clock.now += 2.0
        progress.window(_window(number, 3, start, min(start + 30.0, 65.0)))
    clock.now += 1.5
    progress.finish("transcribing a.wav: 65.0 s of audio in 3 windows, 7.5 s")
    draws = stream.getvalue().split("\r")[1:]
    assert draws[0] == "transcribing a.wav: window 1/3 (0-30 s), 2.0 s"
    assert draws[2] == "transcribing a.wav: window 3/3 (60-65 s), 6.0 s"
    assert draws[3].rstrip() == "transcribing a.wav: 65.0 s of audio in 3 windows, 7.5 s"
    assert draws[3].endswith("\n") and len(draws[3]) - 1 >= len(draws[0])


def test_off_a_terminal_only_the_summary_is_written() -> None:
    stream = io.StringIO()
    progress = TranscribeProgress("transcribing a.wav", stream=stream, clock=Ticks())
    progress.window(_window(1, 3, 0.0, 30.0))
    progress.spin()
    progress.finish("transcribing a.wav: 65.0 s of audio in 3 windows, 0.0 s")
    assert stream.getvalue() == "transcribing a.wav: 65.0 s of audio in 3 windows, 0.0 s\n"


# -- the commands against a fake Inference server -------------------------------------------------


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
    assert main([*served.argv, "transcribe", str(flac), "--capability", "speech"]) == 0
    assert capsys.readouterr().out == "from sample -1\n"
    [request] = served.fake.requests
    assert request.audio.media_type == "audio/flac" and request.audio.data == flac.read_bytes()
    # 4 windows x the 120 s default; gRPC's timeout header rounds up to whole seconds.
    assert 360 < served.fake.deadlines[0] <= 481
    drawn = terminal.getvalue().split("\r")
    assert drawn[1].startswith(f"transcribing {flac}: | ") and "(sent whole)" in drawn[1]
    assert drawn[-1].startswith(f"transcribing {flac}: 95.0 s of audio sent whole, ")
