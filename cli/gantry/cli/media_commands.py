"""`gantry ocr`, `embed-image` and `classify`, and what they share with `gantry transcribe`
(transcribe_command.py): media files read and typed locally (media_files), sent with the local
client key in as many Inference calls as the server's per-call bounds need, and printed in the
order the files were given.

A file that cannot be sent (missing, unreadable, empty, an unknown or wrong media type) is a usage
error: one line, exit 2, before any call. A refused call prints the way every command prints one
(errors.py), exit 1.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import AddCommand, CommandContext, Handler
from gantry.cli.embed import (
    embeddings_document,
    embeddings_lines,
    float32_value,
    response_vectors,
)
from gantry.cli.errors import CliError
from gantry.cli.media_files import (
    IMAGE_TYPES,
    MediaFile,
    MediaFileError,
    read_media_file,
    split_image_calls,
)
from gantry.cli.output import add_output_argument, print_json, wants_json
from gantry.cli.tables import render_table
from gantry.common.arg_types import non_negative, positive_seconds
from gantry.common.inference_limits import MAX_IMAGE_REQUEST_BYTES, MAX_IMAGES
from gantry.common.operations import CLASSIFY_IMAGE, EMBED_IMAGE, RECOGNIZE_TEXT
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc

# A call may wait for a model host to come back, and a window is a full generate on CPU.
CALL_TIMEOUT_S = 120.0


def add_media_commands(command: AddCommand) -> None:
    """Register ocr, embed-image and classify through main.py's `command(name, handler, help)`."""
    ocr = command(RECOGNIZE_TEXT.cli_verb, ocr_command, RECOGNIZE_TEXT.cli_help)
    _add_image_arguments(ocr)
    embed_image = command(EMBED_IMAGE.cli_verb, embed_image_command, EMBED_IMAGE.cli_help)
    _add_image_arguments(embed_image)
    classify = command(CLASSIFY_IMAGE.cli_verb, classify_command, CLASSIFY_IMAGE.cli_help)
    _add_image_arguments(classify)
    classify.add_argument(
        "--labels",
        nargs="+",
        action="extend",
        required=True,
        metavar="LABEL",
        help='candidate labels, each one argument ("a photo of a cat"; commas are kept); '
        "repeatable. They take every word up to the next option: give the FILEs first, or "
        "after -- (classify --labels a b -- x.png)",
    )
    classify.add_argument(
        "--top-k", type=non_negative, default=0, metavar="K", help="best K per image (0: all)"
    )


def add_target_arguments(parser: CommandSpec) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--capability", metavar="NAME", help="the capability to call")
    target.add_argument("--deployment-id", metavar="ID", help="one deployment, by id")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=CALL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"deadline of each call (default {CALL_TIMEOUT_S:g}; a clip sent whole gets it per "
        "30 s of audio)",
    )
    add_output_argument(parser)


def _add_image_arguments(parser: CommandSpec) -> None:
    parser.set_defaults(command_parser=parser)
    parser.add_argument("files", nargs="*", metavar="FILE", help="PNG, JPEG or WebP images")
    add_target_arguments(parser)
    parser.add_argument(
        "--media-type",
        choices=IMAGE_TYPES,
        help="every FILE's type (default: each file's, from its first bytes)",
    )


def usage_errors(handler: Handler) -> Handler:
    """A MediaFileError is a usage error: one line and exit 2, like argparse's own."""

    @functools.wraps(handler)
    def run(context: CommandContext, args: argparse.Namespace) -> int:
        try:
            return handler(context, args)
        except MediaFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run


def target_of(args: argparse.Namespace) -> dict[str, str]:
    if args.deployment_id:
        return {"deployment_id": args.deployment_id}
    return {"capability": args.capability}


def one_line(text: str) -> str:
    return " ".join(text.split())


def _expect(count: int, expected: int, what: str) -> None:
    if count != expected:
        raise CliError(f"the server answered {count} {what} for {expected} images")


# -- images ---------------------------------------------------------------------------------------


def _read_images(args: argparse.Namespace, command: str) -> list[MediaFile]:
    if not args.files:
        # `classify --labels a b x.png` gives x.png to --labels: say how to end the labels.
        hint = " (before --labels, or after the labels and --)" if command == "classify" else ""
        args.command_parser.error(f"give at least one FILE{hint}")
    return [
        read_media_file(path, accepted=IMAGE_TYPES, command=command, declared=args.media_type)
        for path in args.files
    ]


@dataclass(frozen=True, slots=True)
class _ImageRpc:
    """One image command's Inference call: the RPC, its request for a run of images (with the
    command's arguments), and the repeated field that holds one answer per image."""

    command: str
    rpc: Callable[[inference_pb2_grpc.InferenceStub], Callable[..., Any]]
    request: Callable[[list[common_pb2.Image], argparse.Namespace], Message]
    answers: Callable[[Any], Sized]
    what: str


_RECOGNIZE_TEXT = _ImageRpc(
    RECOGNIZE_TEXT.cli_verb,
    lambda stub: stub.RecognizeText,
    lambda images, args: inference_pb2.RecognizeTextRequest(images=images, **target_of(args)),
    lambda response: response.texts,
    "texts",
)
_EMBED_IMAGE = _ImageRpc(
    EMBED_IMAGE.cli_verb,
    lambda stub: stub.EmbedImage,
    lambda images, args: inference_pb2.EmbedImageRequest(images=images, **target_of(args)),
    lambda response: response.vectors,
    "vectors",
)
_CLASSIFY_IMAGE = _ImageRpc(
    CLASSIFY_IMAGE.cli_verb,
    lambda stub: stub.ClassifyImage,
    lambda images, args: inference_pb2.ClassifyImageRequest(
        images=images, labels=args.labels, top_k=args.top_k, **target_of(args)
    ),
    lambda response: response.results,
    "results",
)


def _send_images(
    context: CommandContext, args: argparse.Namespace, call: _ImageRpc
) -> tuple[list[MediaFile], list[tuple[range, Any]]]:
    """The command's FILEs, and each run of them (split_image_calls) sent by `call`, with the
    images each answer is for; an answer with other than one of `call.what` per image is refused.

    The runs stay within the control plane's default bounds (inference_limits); a server run with
    lower ones refuses a call by naming its limit."""
    images = _read_images(args, call.command)
    metadata = context.client_metadata()
    calls = split_image_calls(
        [len(image.data) for image in images],
        max_images=MAX_IMAGES,
        max_request_bytes=MAX_IMAGE_REQUEST_BYTES,
    )
    answered: list[tuple[range, Any]] = []
    with context.open_channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for number, indexes in enumerate(calls, start=1):
            payload = [
                common_pb2.Image(data=images[index].data, media_type=images[index].media_type)
                for index in indexes
            ]
            try:
                response = call.rpc(stub)(
                    call.request(payload, args), metadata=metadata, timeout=args.timeout
                )
                _expect(len(call.answers(response)), len(payload), call.what)
                answered.append((indexes, response))
            except grpc.RpcError:
                if len(calls) > 1:
                    # The error's indexes (images[2]) count within this call, not all the files.
                    print(
                        f"note: call {number} of {len(calls)} failed; it held files "
                        f"{indexes.start}..{indexes.stop - 1} ({images[indexes.start].path} .. "
                        f"{images[indexes.stop - 1].path}), so images[i] in the error is file "
                        f"{indexes.start}+i",
                        file=sys.stderr,
                    )
                raise
    return images, answered


def _results_document(
    answered: Sequence[tuple[range, Any]], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON record of ocr and classify: the first answer's deployment and node, one result per
    file, and each call with how many images it held."""
    first = answered[0][1]
    return {
        "deployment_id": first.deployment_id,
        "node_id": first.node_id,
        "results": results,
        "calls": [
            {
                "deployment_id": response.deployment_id,
                "node_id": response.node_id,
                "images": len(run),
            }
            for run, response in answered
        ],
    }


@usage_errors
def ocr_command(context: CommandContext, args: argparse.Namespace) -> int:
    images, answered = _send_images(context, args, _RECOGNIZE_TEXT)
    texts = [text for _, response in answered for text in response.texts]
    if wants_json(args):
        results = [
            {"file": image.path, "media_type": image.media_type, "text": text}
            for image, text in zip(images, texts, strict=True)
        ]
        print_json(_results_document(answered, results))
        return 0
    # One line per file, FILE<TAB>text: `cut -f2` gives the texts (whitespace runs made one space).
    for image, text in zip(images, texts, strict=True):
        print(f"{image.path}\t{one_line(text)}")
    return 0


@usage_errors
def embed_image_command(context: CommandContext, args: argparse.Namespace) -> int:
    images, answered = _send_images(context, args, _EMBED_IMAGE)
    responses = [response for _, response in answered]
    vectors = response_vectors(responses)
    if wants_json(args):
        # The record `gantry embed -o json` prints, with each vector's file.
        print_json(embeddings_document(responses, vectors, files=[image.path for image in images]))
        return 0
    for line in embeddings_lines(responses, vectors, [image.path for image in images]):
        print(line)
    return 0


@usage_errors
def classify_command(context: CommandContext, args: argparse.Namespace) -> int:
    images, answered = _send_images(context, args, _CLASSIFY_IMAGE)
    results = [result for _, response in answered for result in response.results]
    if wants_json(args):
        per_file = [
            {
                "file": image.path,
                # Every field, index 0 included (proto JSON would leave it out).
                "labels": [
                    {"label": s.label, "index": s.index, "score": float32_value(s.score)}
                    for s in result.labels
                ],
            }
            for image, result in zip(images, results, strict=True)
        ]
        print_json(_results_document(answered, per_file))
        return 0
    rows: list[list[str]] = []
    for image, result in zip(images, results, strict=True):
        for rank, score in enumerate(result.labels):
            rows.append([image.path if rank == 0 else "", score.label, f"{score.score:.4f}"])
    print(render_table(["FILE", "LABEL", "SCORE"], rows))
    return 0
