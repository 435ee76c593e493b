"""`gantry transcribe FILE`: one clip, read and typed locally (media_files). A WAV or raw PCM clip
longer than one 30 s window is cut into windows here and sent one Transcribe per window, with
progress on stderr (media_progress) and every segment's time counted from the clip's start; any
other clip (FLAC, a WAV the `wave` module cannot read, or --whole) is sent whole, the server
windowing it, with an elapsed-time spinner on a terminal.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import AddCommand, CommandContext, Metadata
from gantry.cli.media_commands import (
    add_target_arguments,
    one_line,
    target_of,
    usage_errors,
)
from gantry.cli.media_files import (
    AUDIO_TYPES,
    FLAC,
    PCM,
    WAV,
    WINDOW_SECONDS,
    ClipWindow,
    MediaFile,
    PcmClip,
    clip_windows,
    flac_seconds,
    merged_transcript,
    pcm_clip,
    read_media_file,
    wav_clip,
    window_audio,
    window_count,
)
from gantry.cli.media_progress import (
    SPIN_EVERY_S,
    TranscribeProgress,
    whole_summary,
    window_label,
    windows_summary,
)
from gantry.cli.output import print_json, wants_json
from gantry.common.arg_types import non_negative
from gantry.common.operations import TRANSCRIBE
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc


def add_transcribe_command(command: AddCommand) -> None:
    """Register `transcribe` through main.py's `command(name, handler, help)`."""
    transcribe = command(TRANSCRIBE.cli_verb, transcribe_command, TRANSCRIBE.cli_help)
    transcribe.set_defaults(command_parser=transcribe)
    transcribe.add_argument("file", metavar="FILE", help="a WAV or FLAC file, or raw PCM")
    add_target_arguments(transcribe)
    transcribe.add_argument(
        "--media-type",
        choices=AUDIO_TYPES,
        help="the file's type (default: from its first bytes; raw PCM has none)",
    )
    transcribe.add_argument(
        "--sample-rate", type=_positive, metavar="HZ", help="audio/pcm: samples per second"
    )
    transcribe.add_argument(
        "--channels", type=_positive, metavar="N", help="audio/pcm: interleaved channels (1)"
    )
    transcribe.add_argument(
        "--language", default="", help="a code such as en (default: the profile's, else detected)"
    )
    transcribe.add_argument(
        "--timestamps", action="store_true", help="print each segment with its start and end"
    )
    transcribe.add_argument(
        "--whole",
        action="store_true",
        help="send a long WAV or PCM clip in one call (the server windows it) instead of one "
        "call per 30 s window with progress",
    )


def _positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not above 0")
    return value


def _read_audio(args: argparse.Namespace) -> tuple[MediaFile, PcmClip | None]:
    """The file, and its frames when the CLI can cut it into windows (a PCM WAV, raw PCM)."""
    parser: CommandSpec = args.command_parser
    if args.media_type == PCM and args.sample_rate is None:
        parser.error("--media-type audio/pcm needs --sample-rate HZ (and --channels N if not 1)")
    if args.media_type != PCM and (args.sample_rate is not None or args.channels is not None):
        parser.error("--sample-rate and --channels describe raw PCM: add --media-type audio/pcm")
    media = read_media_file(
        args.file, accepted=AUDIO_TYPES, command="transcribe", declared=args.media_type
    )
    if media.media_type == PCM:
        channels = args.channels or 1
        return media, pcm_clip(
            media.path, media.data, sample_rate_hz=args.sample_rate, channels=channels
        )
    if media.media_type == WAV:
        return media, wav_clip(media.data)
    return media, None


def _whole_audio(media: MediaFile, clip: PcmClip | None) -> common_pb2.Audio:
    audio = common_pb2.Audio(data=media.data, media_type=media.media_type)
    if media.media_type == PCM and clip is not None:
        audio.sample_rate_hz, audio.channels = clip.sample_rate_hz, clip.channels
    return audio


def _known_seconds(media: MediaFile, clip: PcmClip | None) -> float | None:
    if clip is not None:
        return clip.seconds
    return flac_seconds(media.data) if media.media_type == FLAC else None


@usage_errors
def transcribe_command(context: CommandContext, args: argparse.Namespace) -> int:
    media, clip = _read_audio(args)
    metadata = context.client_metadata()
    windows = clip_windows(clip) if clip is not None and not args.whole else []
    progress = TranscribeProgress(f"transcribing {media.path}")
    with context.open_channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        if clip is not None and len(windows) > 1:
            result, calls = _by_windows(stub, metadata, args, clip, media, windows, progress)
            progress.finish(
                windows_summary(
                    progress.label,
                    audio_seconds=result.audio_seconds,
                    windows=len(windows),
                    elapsed_s=progress.elapsed_s,
                )
            )
        else:
            seconds = _known_seconds(media, clip)
            request = inference_pb2.TranscribeRequest(
                audio=_whole_audio(media, clip),
                language=args.language,
                timestamps=args.timestamps,
                **target_of(args),
            )
            timeout = args.timeout * (window_count(seconds) if seconds else 1)
            long_clip = seconds is None or seconds > WINDOW_SECONDS
            result = _spun_call(stub, request, metadata, timeout, progress if long_clip else None)
            calls = [_call_record(0.0, result.audio_seconds, result)]
            if result.audio_seconds > WINDOW_SECONDS:
                progress.finish(
                    whole_summary(
                        progress.label,
                        audio_seconds=result.audio_seconds,
                        elapsed_s=progress.elapsed_s,
                    )
                )
            else:
                progress.clear()
    _print_transcript(args, result, calls)
    return 0


def _call_record(
    start_s: float, end_s: float, response: inference_pb2.TranscribeResponse
) -> dict[str, Any]:
    return {
        "start_s": start_s,
        "end_s": end_s,
        "deployment_id": response.deployment_id,
        "node_id": response.node_id,
    }


def _by_windows(
    stub: inference_pb2_grpc.InferenceStub,
    metadata: Metadata,
    args: argparse.Namespace,
    clip: PcmClip,
    media: MediaFile,
    windows: Sequence[ClipWindow],
    progress: TranscribeProgress,
) -> tuple[inference_pb2.TranscribeResponse, list[dict[str, Any]]]:
    """One Transcribe per window, in order. The first window's language is asked of the rest,
    as the server detects a whole clip's language once, on its first window."""
    responses: list[inference_pb2.TranscribeResponse] = []
    language = args.language
    for window in windows:
        progress.window(window)
        request = inference_pb2.TranscribeRequest(
            audio=window_audio(clip, window, media_type=media.media_type),
            language=language,
            timestamps=args.timestamps,
            **target_of(args),
        )
        try:
            response: inference_pb2.TranscribeResponse = stub.Transcribe(
                request, metadata=metadata, timeout=args.timeout
            )
        except grpc.RpcError:
            progress.abandon()
            print(f"note: {window_label(window)} failed", file=sys.stderr)
            raise
        responses.append(response)
        language = language or response.language
    calls = [
        _call_record(window.start_s, window.end_s, response)
        for window, response in zip(windows, responses, strict=True)
    ]
    return merged_transcript(windows, responses), calls


def _spun_call(
    stub: inference_pb2_grpc.InferenceStub,
    request: inference_pb2.TranscribeRequest,
    metadata: Metadata,
    timeout_s: float,
    progress: TranscribeProgress | None,
) -> inference_pb2.TranscribeResponse:
    """One Transcribe; on a terminal, a spinner turns while it runs."""
    if progress is None or not progress.interactive:
        response: inference_pb2.TranscribeResponse = stub.Transcribe(
            request, metadata=metadata, timeout=timeout_s
        )
        return response
    future = stub.Transcribe.future(request, metadata=metadata, timeout=timeout_s)
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    try:
        while not done.wait(SPIN_EVERY_S):
            progress.spin()
        answered: inference_pb2.TranscribeResponse = future.result()
    except BaseException:
        # A refusal, or Ctrl-C while waiting: end the spinner's line, and do not leave the call
        # running on the server for nobody.
        future.cancel()
        progress.abandon()
        raise
    return answered


def _print_transcript(
    args: argparse.Namespace,
    result: inference_pb2.TranscribeResponse,
    calls: Sequence[dict[str, Any]],
) -> None:
    if wants_json(args):
        print_json(
            {
                "text": result.text,
                "language": result.language,
                "audio_seconds": result.audio_seconds,
                "segments": [
                    {"start_s": s.start_s, "end_s": s.end_s, "text": s.text}
                    for s in result.segments
                ],
                "deployment_id": result.deployment_id,
                "node_id": result.node_id,
                # One entry per Transcribe call: a long WAV or PCM clip goes window by window.
                "calls": list(calls),
            }
        )
        return
    print(result.text)
    if args.timestamps:
        for segment in result.segments:
            print(f"[{segment.start_s:7.2f} - {segment.end_s:7.2f}] {one_line(segment.text)}")
