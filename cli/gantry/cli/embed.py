"""`gantry embed`: texts from arguments, files and standard input, embedded with the local client
key in as many Inference.Embed calls as the control plane's per-call bounds need, printed in input
order."""

from __future__ import annotations

import argparse
import array
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import grpc

from gantry.cli.connection import AddCommand, CommandContext
from gantry.cli.errors import CliError
from gantry.common.inference_limits import MAX_INPUTS, MAX_REQUEST_TEXT_BYTES
from gantry.common.operations import EMBED
from gantry.v1 import inference_pb2, inference_pb2_grpc

# The first call may wait for a model host to come back; allow more than an operator call.
EMBED_TIMEOUT_S = 120.0
STDIN_PATH = "-"
_SHOWN_VALUES = 8


def add_embed_command(command: AddCommand) -> None:
    parser = command(EMBED.cli_verb, embed, EMBED.cli_help)
    parser.set_defaults(command_parser=parser)
    parser.add_argument("texts", nargs="*", metavar="TEXT")
    parser.add_argument(
        "--file",
        dest="files",
        action="append",
        default=[],
        metavar="PATH",
        help="embed the text of a file ('-': standard input); repeatable, after the TEXTs",
    )
    parser.add_argument(
        "--lines", action="store_true", help="each non-empty line of a --file is one text"
    )
    parser.add_argument(
        "--truncate",
        action="store_true",
        help="cut texts past the model's token limit instead of refusing them (INPUT_TOO_LONG)",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--capability", default="minilm")
    target.add_argument("--deployment-id")
    parser.add_argument("--json", action="store_true", help="print every value as JSON")


def read_text_file(path: str, stdin: BinaryIO) -> str:
    """The UTF-8 text of one `--file PATH` (`-`: standard input); a CliError naming it if unread."""
    name = "standard input" if path == STDIN_PATH else path
    try:
        data = stdin.read() if path == STDIN_PATH else Path(path).read_bytes()
        return data.decode("utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {name}: not UTF-8 text (byte {exc.start})") from exc


def non_empty_lines(text: str) -> list[str]:
    """Each line holding more than whitespace, without its line ending (`\n` or `\r\n`)."""
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return [line for line in lines if line.strip()]


def gather_texts(
    arguments: Sequence[str], files: Sequence[str], *, lines: bool, stdin: BinaryIO
) -> list[str]:
    """The TEXT arguments, then each file's text (or its non-empty lines) in the order given."""
    texts = list(arguments)
    for path in files:
        text = read_text_file(path, stdin)
        if lines:
            texts.extend(non_empty_lines(text))
        else:
            texts.append(text)
    return texts


def split_calls(
    texts: Sequence[str],
    *,
    max_inputs: int = MAX_INPUTS,
    max_text_bytes: int = MAX_REQUEST_TEXT_BYTES,
) -> list[list[str]]:
    """Consecutive runs of texts, each within the control plane's bounds on one call: at most
    `max_inputs` texts and `max_text_bytes` of text (a single larger text still gets its own call,
    for the control plane to refuse by name)."""
    calls: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    for text in texts:
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if current and (len(current) >= max_inputs or current_bytes + size > max_text_bytes):
            calls.append(current)
            current, current_bytes = [], 0
        current.append(text)
        current_bytes += size
    if current:
        calls.append(current)
    return calls


def vector_values(vector: inference_pb2.Vector, encoding: int) -> list[float]:
    if encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES:
        values = array.array("f")
        values.frombytes(vector.float32_le)
        if sys.byteorder == "big":
            values.byteswap()
        return values.tolist()
    return list(vector.values)


def float32_value(value: float) -> float:
    # Nine significant digits round-trip a float32 exactly, without float64 noise digits.
    return float(f"{value:.9g}")


# ---- what `gantry embed` and `gantry embed-image` print (pure) -----------------------------------


def response_vectors(responses: Sequence[inference_pb2.EmbedResponse]) -> list[list[float]]:
    """Every call's vectors, in call order: the inputs' order."""
    return [
        vector_values(vector, response.encoding)
        for response in responses
        for vector in response.vectors
    ]


def embedding_dim(responses: Sequence[inference_pb2.EmbedResponse], vectors: Sequence[Any]) -> int:
    return responses[0].dim or (len(vectors[0]) if vectors else 0)


def embeddings_document(
    responses: Sequence[inference_pb2.EmbedResponse],
    vectors: Sequence[Sequence[float]],
    *,
    files: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The JSON record: the first answer's deployment and node, the vectors, and `files` (for
    embed-image, each vector's file) when given."""
    first = responses[0]
    document: dict[str, Any] = {
        "deployment_id": first.deployment_id,
        "node_id": first.node_id,
        "dim": embedding_dim(responses, vectors),
    }
    if files is not None:
        document["files"] = list(files)
    document["vectors"] = [[float32_value(value) for value in vector] for vector in vectors]
    # One entry per call, in order: a large input is split into calls within the per-call bounds.
    document["calls"] = [
        {
            "deployment_id": response.deployment_id,
            "node_id": response.node_id,
            "vectors": len(response.vectors),
        }
        for response in responses
    ]
    return document


def embeddings_lines(
    responses: Sequence[inference_pb2.EmbedResponse],
    vectors: Sequence[Sequence[float]],
    labels: Sequence[str],
) -> list[str]:
    """A summary line, then each vector's first values after its label (a text or a file)."""
    first = responses[0]
    in_calls = f" in {len(responses)} calls" if len(responses) > 1 else ""
    lines = [
        f"{len(vectors)} vector(s), dim {embedding_dim(responses, vectors)},"
        f" deployment {first.deployment_id}{in_calls}"
    ]
    for index, (label, vector) in enumerate(zip(labels, vectors, strict=False)):
        head = ", ".join(f"{value:+.4f}" for value in vector[:_SHOWN_VALUES])
        more = ", …" if len(vector) > _SHOWN_VALUES else ""
        lines.append(f"[{index}] {label!r}: [{head}{more}]")
    return lines


def _preview(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def embed(context: CommandContext, args: argparse.Namespace) -> int:
    if not args.texts and not args.files:
        args.command_parser.error("give at least one TEXT or --file PATH")
    texts = gather_texts(args.texts, args.files, lines=args.lines, stdin=sys.stdin.buffer)
    if not texts:
        args.command_parser.error("the files given hold no text to embed")
    responses = _embed_calls(context, args, texts)
    vectors = response_vectors(responses)
    if args.json:
        print(json.dumps(embeddings_document(responses, vectors)))
        return 0
    for line in embeddings_lines(responses, vectors, [_preview(text) for text in texts]):
        print(line)
    return 0


def _embed_calls(
    context: CommandContext, args: argparse.Namespace, texts: Sequence[str]
) -> list[inference_pb2.EmbedResponse]:
    """The texts embedded in as many Embed calls as split_calls makes, in order."""
    metadata = context.client_metadata()
    responses: list[inference_pb2.EmbedResponse] = []
    calls = split_calls(texts)
    first_text = 0
    with context.open_channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for number, inputs in enumerate(calls, start=1):
            request = inference_pb2.EmbedRequest(inputs=inputs, truncate=args.truncate)
            if args.deployment_id:
                request.deployment_id = args.deployment_id
            else:
                request.capability = args.capability
            try:
                responses.append(stub.Embed(request, metadata=metadata, timeout=EMBED_TIMEOUT_S))
            except grpc.RpcError:
                if len(calls) > 1:
                    # The error's indexes (inputs[3]) count within this call, not the whole input.
                    print(
                        f"note: call {number} of {len(calls)} failed; it held texts "
                        f"{first_text}..{first_text + len(inputs) - 1}, so inputs[i] in the "
                        f"error is text {first_text}+i",
                        file=sys.stderr,
                    )
                raise
            first_text += len(inputs)
    return responses
