"""`gantry ocr`, `embed-image`, `classify` and `transcribe`: media types from magic bytes, files
that cannot be sent refused in one line (exit 2) before any call, images batched inside the per-call
bounds, a long WAV or PCM clip cut into 30 s windows whose segment times are moved to the clip's
start, and progress on stderr. The commands against a fake Inference server over real gRPC:
tests/integration/test_cli_media_fake_server.py."""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import pytest

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
from gantry.v1 import common_pb2, inference_pb2
from tests.unit.test_cli_progress import terminal_frames

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
        (["ocr"], "error: one of the options --capability --deployment-id is required"),
        (["ocr", "--capability", "o"], "error: give at least one FILE"),
        (
            ["classify", "--capability", "c", "--labels", "a", "{tmp}/x.png"],
            "error: give at least one FILE (before --labels, or after the labels and --)",
        ),
        (
            ["classify", "{tmp}/x.png", "--capability", "c"],
            "Missing option '--labels'",
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
            "Invalid value for '--sample-rate': 0 is not above 0",
        ),
        (
            ["classify", "{tmp}/x.png", "--capability", "c", "--labels", "a", "--top-k", "-1"],
            "Invalid value for '--top-k': -1 is negative",
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
    assert f"gantry {argv[0]}: error:" in err and expected in err


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
    draws = terminal_frames(stream.getvalue())
    assert draws[0] == "transcribing a.wav: window 1/3 (0-30 s), 2.0 s"
    assert draws[2] == "transcribing a.wav: window 3/3 (60-65 s), 6.0 s"
    assert draws[3] == "transcribing a.wav: 65.0 s of audio in 3 windows, 7.5 s\n"
    # Each redraw first erases the whole line, so a shorter one leaves nothing of a longer one.
    assert stream.getvalue().count("\r\x1b[2K") == 3


def test_off_a_terminal_only_the_summary_is_written() -> None:
    stream = io.StringIO()
    progress = TranscribeProgress("transcribing a.wav", stream=stream, clock=Ticks())
    progress.window(_window(1, 3, 0.0, 30.0))
    progress.spin()
    progress.finish("transcribing a.wav: 65.0 s of audio in 3 windows, 0.0 s")
    assert stream.getvalue() == "transcribing a.wav: 65.0 s of audio in 3 windows, 0.0 s\n"
