"""`gantry generate PROMPT`: text generation with the local client key.

By default the text is printed as it is produced (GenerateStream: each chunk written and flushed
as it arrives), then a newline, and the finish reason and token counts on stderr, so stdout holds
the text alone. `--no-stream` asks Generate for the whole text at once; `-o json` prints one JSON
object (the proto's field names, as grpcurl prints them) and nothing else on stdout. `--chat` (or
`--system TEXT`) sends PROMPT as a user's message, rendered by the model's own chat template.
Ctrl-C cancels the call (the generation stops in the model host) and exits 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import AddCommand, CommandContext
from gantry.cli.embed import read_text_file
from gantry.cli.output import add_output_argument, message_dict, print_json, wants_json
from gantry.common.arg_types import non_negative, positive_seconds
from gantry.common.operations import GENERATE
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc

# A generation of a few hundred tokens on a CPU takes tens of seconds, after a model host may
# have had to come back.
GENERATE_TIMEOUT_S = 300.0
STDIN = "-"
INTERRUPTED = 130  # what a shell reports for a command ended by SIGINT


def add_generate_command(command: AddCommand) -> None:
    """Register `generate` through main.py's `command(name, handler, help)`."""
    parser = command(GENERATE.cli_verb, generate_command, GENERATE.cli_help)
    parser.set_defaults(command_parser=parser)
    parser.add_argument(
        "prompt", metavar="PROMPT", help="the text to continue ('-': read it from standard input)"
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--capability", metavar="NAME", help="the capability to call")
    target.add_argument("--deployment-id", metavar="ID", help="one deployment, by id")
    _add_sampling_arguments(parser)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send PROMPT as a user's message, rendered by the model's chat template",
    )
    parser.add_argument(
        "--system",
        metavar="TEXT",
        help="a system message before PROMPT (implies --chat)",
    )
    parser.add_argument(
        "--no-stream",
        action="store_true",
        help="ask for the whole text at once (Generate) instead of streaming it",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=GENERATE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"deadline of the call (default {GENERATE_TIMEOUT_S:g})",
    )
    add_output_argument(parser)


def _add_sampling_arguments(parser: CommandSpec) -> None:
    """How many tokens, where to stop, and how each token is chosen (GenerateRequest.sampling)."""
    parser.add_argument(
        "--max-tokens",
        type=non_negative,
        default=0,
        metavar="N",
        help="new tokens at most (default: as many as the deployment allows)",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the text before this string (repeatable, at most 16)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 (default): greedy, the most likely token each step; up to 2: sample",
    )
    parser.add_argument(
        "--top-p", type=float, default=0.0, metavar="P", help="nucleus sampling, 0..1 (0: off)"
    )
    parser.add_argument(
        "--top-k", type=non_negative, default=0, metavar="K", help="sample from the K most likely"
    )
    parser.add_argument(
        "--seed",
        type=non_negative,
        default=0,
        metavar="N",
        help="with --temperature: the same seed gives the same text (0: unseeded)",
    )


def generate_request(args: argparse.Namespace, prompt: str) -> inference_pb2.GenerateRequest:
    request = inference_pb2.GenerateRequest(
        max_tokens=args.max_tokens,
        stop=args.stop,
        sampling=common_pb2.SamplingSettings(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
        ),
    )
    if args.deployment_id:
        request.deployment_id = args.deployment_id
    else:
        request.capability = args.capability
    if args.chat or args.system is not None:
        if args.system is not None:
            request.messages.add(role="system", content=args.system)
        request.messages.add(role="user", content=prompt)
    else:
        request.prompt = prompt
    return request


def generate_command(context: CommandContext, args: argparse.Namespace) -> int:
    prompt = read_text_file(STDIN, sys.stdin.buffer) if args.prompt == STDIN else args.prompt
    request = generate_request(args, prompt)
    metadata = context.client_metadata()
    with context.open_channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        if args.no_stream:
            response = stub.Generate(request, metadata=metadata, timeout=args.timeout)
        else:
            call = stub.GenerateStream(request, metadata=metadata, timeout=args.timeout)
            try:
                response = _streamed(call, echo=None if wants_json(args) else sys.stdout)
            except KeyboardInterrupt:
                # Cancelled here, not left to the channel's close: the worker is told now.
                call.cancel()
                print("\ncancelled", file=sys.stderr, flush=True)
                return INTERRUPTED
    if wants_json(args):
        print_json(response)
        return 0
    if args.no_stream:
        sys.stdout.write(response.text)
    print(flush=True)
    print(_summary(response), file=sys.stderr)
    return 0


def _streamed(call: Any, *, echo: TextIO | None) -> inference_pb2.GenerateResponse:
    """Every chunk of a GenerateStream call (each text written to `echo` and flushed as it
    arrives), gathered into the response Generate would have given."""
    response = inference_pb2.GenerateResponse()
    texts = []
    chunks: Iterator[inference_pb2.GenerateChunk] = call
    for chunk in chunks:
        if chunk.text:
            texts.append(chunk.text)
            if echo is not None:
                echo.write(chunk.text)
                echo.flush()
        if chunk.finish_reason:
            response.finish_reason = chunk.finish_reason
            response.prompt_tokens = chunk.prompt_tokens
            response.completion_tokens = chunk.completion_tokens
            response.deployment_id = chunk.deployment_id
            response.node_id = chunk.node_id
    response.text = "".join(texts)
    return response


def _summary(response: inference_pb2.GenerateResponse) -> str:
    finish = message_dict(response).get("finish_reason", "FINISH_REASON_UNSPECIFIED")
    return (
        f"{finish.removeprefix('FINISH_REASON_')}: {response.prompt_tokens} prompt + "
        f"{response.completion_tokens} generated tokens, deployment {response.deployment_id} "
        f"on node {response.node_id}"
    )
