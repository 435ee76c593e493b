"""`gantry bench`: load on a capability or deployment through the client API, and what it measured.

Every call carries generated texts that differ per call (so no cache can answer for the model), is
made with the client key of a tenant, and counts as OK or as `CODE/REASON`: failed calls are part of
the measurement, so a run that completes exits 0 whatever they were. `--address a,b` spreads the
calls over control-plane replicas; a call lost with a replica that dies is retried on another, so
it counts as OK (the retry is in its latency).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TextIO

import grpc

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import CommandContext, Metadata, bearer
from gantry.cli.errors import CliError
from gantry.cli.live_line import LiveLine
from gantry.cli.loadgen import (
    MAX_CONCURRENCY,
    CallFactory,
    LoadPlan,
    LoadProgress,
    LoadResult,
    run_load,
)
from gantry.cli.state import read_secret
from gantry.cli.tables import render_table
from gantry.cli.tenant_commands import PRIORITY_NAMES
from gantry.common.client_config import client_channel, split_addresses

# The control plane's bounds on one call: asking for more would only measure INVALID_PAYLOAD
# refusals, so the flags refuse it up front.
from gantry.common.inference_limits import (
    MAX_INPUT_CHARS,
    MAX_INPUTS,
    MAX_REQUEST_TEXT_BYTES,
)
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc

MAX_REQUESTS = 10_000_000
MAX_WARMUP = 100_000
MAX_DURATION_S = 3600.0  # every latency is kept in memory until the end
DEFAULT_REQUESTS = 100
DEFAULT_CONCURRENCY = 1
DEFAULT_INPUT_CHARS = 64
DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
ENCODINGS = {
    "floats": inference_pb2.VECTOR_ENCODING_FLOAT_LIST,
    "bytes": inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
}
_BAR_WIDTH = 28

# Words the bundled and test tokenizers know: generated texts tokenize like prose, not noise.
_WORDS = (
    "the a of to and in is it that for on with as was at by be this from are or have not model "
    "host gantry worker embed vector sentence health probe quick brown fox jumps over lazy dog "
    "hello world one two three four five six seven eight nine ten red green blue cat runs fast slow"
).split()
_OFFSETS = 4099  # a prime: consecutive calls start their texts at unrelated places in the corpus


@functools.cache
def _corpus() -> str:
    """Deterministic prose long enough for the longest input at any offset."""
    chooser = random.Random(0)  # a fixed seed: the same run twice sends the same texts
    words: list[str] = []
    length = 0
    while length < MAX_INPUT_CHARS + _OFFSETS:
        word = chooser.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def bench_text(call_index: int, position: int, chars: int) -> str:
    """Exactly `chars` characters; different for each (call, position) when its tag fits."""
    tag = f"{call_index}.{position} "
    offset = (call_index * 7919 + position * 104_729) % _OFFSETS
    if chars <= len(tag):
        return _corpus()[offset : offset + chars]
    return tag + _corpus()[offset : offset + chars - len(tag)]


def bench_texts(call_index: int, count: int, chars: int) -> list[str]:
    return [bench_text(call_index, position, chars) for position in range(count)]


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, not {value}")
        return value

    return parse


def _seconds(high: float) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not 0 < value <= high:  # also refuses nan
            raise argparse.ArgumentTypeError(
                f"must be more than 0 and at most {high:g}, not {text}"
            )
        return value

    return parse


def add_bench_arguments(bench: CommandSpec) -> None:
    bench.set_defaults(bench_parser=bench)
    target = bench.add_mutually_exclusive_group(required=True)
    target.add_argument("--capability", metavar="NAME")
    target.add_argument("--deployment", "--deployment-id", dest="deployment_id", metavar="ID")
    _add_load_arguments(bench)
    _add_call_arguments(bench)


def _add_load_arguments(bench: CommandSpec) -> None:
    """How much load: calls in flight, how many calls or for how long, and each call's size."""
    bench.add_argument(
        "--concurrency",
        type=_bounded_int(1, MAX_CONCURRENCY),
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"calls in flight at once, 1..{MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})",
    )
    amount = bench.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        type=_bounded_int(1, MAX_REQUESTS),
        metavar="N",
        help=f"make exactly N calls (default {DEFAULT_REQUESTS})",
    )
    amount.add_argument(
        "--duration",
        type=_seconds(MAX_DURATION_S),
        metavar="SECONDS",
        help="start calls until this much time has passed, then let them finish",
    )
    bench.add_argument(
        "--inputs-per-request",
        type=_bounded_int(1, MAX_INPUTS),
        default=1,
        metavar="N",
        help=f"texts per call (documents under --rerank), 1..{MAX_INPUTS} (default 1)",
    )
    bench.add_argument(
        "--input-chars",
        type=_bounded_int(1, MAX_INPUT_CHARS),
        default=DEFAULT_INPUT_CHARS,
        metavar="N",
        help=f"characters per text (and the query), 1..{MAX_INPUT_CHARS} "
        f"(default {DEFAULT_INPUT_CHARS})",
    )


def _add_call_arguments(bench: CommandSpec) -> None:
    """What each call is and how it is made, measured and reported."""
    bench.add_argument("--priority", choices=sorted(PRIORITY_NAMES), help="default: the server's")
    bench.add_argument("--rerank", action="store_true", help="call Rerank instead of Embed")
    bench.add_argument(
        "--encoding", choices=sorted(ENCODINGS), help="Embed's vector encoding (default floats)"
    )
    bench.add_argument(
        "--warmup",
        type=_bounded_int(0, MAX_WARMUP),
        default=0,
        metavar="N",
        help="calls made and discarded before measuring (default 0)",
    )
    bench.add_argument(
        "--key-file",
        metavar="PATH",
        help="the client API key to call with, i.e. the tenant (default <state>/client.key)",
    )
    bench.add_argument(
        "--timeout",
        type=_seconds(3600.0),
        default=DEFAULT_CALL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"deadline of each call (default {DEFAULT_CALL_TIMEOUT_S:g})",
    )
    bench.add_argument(
        "--connect-timeout",
        type=_seconds(600.0),
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the control plane (default {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")


def _check_combination(args: argparse.Namespace) -> None:
    """What no single flag's type can see; a parser error (exit 2), like theirs."""
    parser: CommandSpec = args.bench_parser
    if args.rerank and args.encoding is not None:
        parser.error("--encoding applies to Embed; Rerank returns scores")
    texts = args.inputs_per_request + (1 if args.rerank else 0)  # generated texts are ASCII
    if texts * args.input_chars > MAX_REQUEST_TEXT_BYTES:
        parser.error(
            f"--inputs-per-request x --input-chars makes {texts * args.input_chars} bytes of text"
            f" per call; the control plane takes at most {MAX_REQUEST_TEXT_BYTES}"
        )


def _target(args: argparse.Namespace) -> dict[str, str]:
    if args.deployment_id:
        return {"deployment_id": args.deployment_id}
    return {"capability": args.capability}


def _aim(request: inference_pb2.EmbedRequest | inference_pb2.RerankRequest, args: Any) -> None:
    if args.deployment_id:
        request.deployment_id = args.deployment_id
    else:
        request.capability = args.capability


def _call_factory(
    stub: inference_pb2_grpc.InferenceStub,
    args: argparse.Namespace,
    metadata: Metadata,
) -> CallFactory:
    priority = (
        common_pb2.Priority.Value(f"PRIORITY_{args.priority.upper()}")
        if args.priority
        else common_pb2.PRIORITY_UNSPECIFIED
    )
    count, chars = args.inputs_per_request, args.input_chars

    if args.rerank:

        def rerank(index: int) -> Awaitable[object]:
            request = inference_pb2.RerankRequest(
                query=bench_text(index, count, chars),
                documents=bench_texts(index, count, chars),
                priority=priority,
                truncate=True,  # as before INPUT_TOO_LONG: --input-chars past the model is cut
            )
            _aim(request, args)
            return stub.Rerank(request, metadata=metadata, timeout=args.timeout)

        return rerank

    encoding = ENCODINGS[args.encoding or "floats"]

    def embed(index: int) -> Awaitable[object]:
        request = inference_pb2.EmbedRequest(
            inputs=bench_texts(index, count, chars),
            priority=priority,
            encoding=encoding,
            truncate=True,  # as before INPUT_TOO_LONG: --input-chars past the model is cut
        )
        _aim(request, args)
        return stub.Embed(request, metadata=metadata, timeout=args.timeout)

    return embed


def _plan(args: argparse.Namespace) -> LoadPlan:
    return LoadPlan(
        concurrency=args.concurrency,
        requests=None if args.duration else (args.requests or DEFAULT_REQUESTS),
        duration_s=args.duration,
        warmup=args.warmup,
        inputs_per_call=args.inputs_per_request,
    )


def render_bench_progress(progress: LoadProgress, *, width: int = _BAR_WIDTH) -> str:
    """One line, e.g. `bench [#######.....]  120/500 calls  24%  48.2 calls/s`."""
    filled = round(progress.fraction * width)
    bar = "#" * filled + "." * (width - filled)
    rate = progress.done / progress.elapsed_s if progress.elapsed_s > 0 else 0.0
    if progress.total is not None:
        amount = f"{progress.done}/{progress.total} calls"
    else:
        amount = f"{progress.elapsed_s:.1f}/{progress.duration_s or 0:.1f} s {progress.done} calls"
    return f"bench [{bar}] {amount} {progress.fraction * 100:3.0f}% {rate:.1f} calls/s"


class BenchProgressBar:
    """Redraws one line on a terminal; draws nothing into a log (the report follows anyway)."""

    def __init__(self, stream: TextIO) -> None:
        self._line = LiveLine(stream)

    def __call__(self, progress: LoadProgress) -> None:
        self._line.draw(render_bench_progress(progress))

    def close(self) -> None:
        self._line.abandon()


def _milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_report(document: dict[str, Any]) -> str:
    """The human form of `bench_document`: a few lines and the errors by reason."""
    plan, latency = document["plan"], document["latency_ms"]
    target = ", ".join(f"{key} {value}" for key, value in document["target"].items())
    amount = f"{plan['requests']} requests" if plan["requests"] else f"{plan['duration_s']:g} s"
    lines = [
        f"{document['method']} {target}: {amount}, concurrency {plan['concurrency']}, "
        f"{plan['inputs_per_request']} input(s) x {plan['input_chars']} chars, "
        f"{plan['warmup']} warm-up",
        f"requests    {document['requests']} (ok {document['ok']}, "
        f"errors {document['requests'] - document['ok']})",
        f"elapsed     {document['elapsed_s']:.3f} s",
        f"throughput  {document['requests_per_s']:.1f} req/s, "
        f"{document['inputs_per_s']:.1f} inputs/s",
        "latency ms  "
        + "  ".join(f"{name} {_milliseconds(latency[name])}" for name in ("p50", "p90", "p99"))
        + f"  max {_milliseconds(latency['max'])}  (ok calls)",
    ]
    if document["errors"]:
        rows = [[outcome, str(count)] for outcome, count in document["errors"].items()]
        lines += ["", render_table(["ERROR (CODE/REASON)", "CALLS"], rows)]
    return "\n".join(lines)


def bench_document(args: argparse.Namespace, plan: LoadPlan, result: LoadResult) -> dict[str, Any]:
    return {
        "method": "Rerank" if args.rerank else "Embed",
        "target": _target(args),
        "plan": {
            "concurrency": plan.concurrency,
            "requests": plan.requests,
            "duration_s": plan.duration_s,
            "warmup": plan.warmup,
            "inputs_per_request": args.inputs_per_request,
            "input_chars": args.input_chars,
            "priority": args.priority,
        },
        **result.summary(),
    }


async def _measure(
    context: CommandContext, args: argparse.Namespace, metadata: Metadata, plan: LoadPlan
) -> LoadResult:
    # Several replicas (--address a,b): calls go round robin to those that answer, and a call
    # in flight on one that dies is retried on another (gantry.common.client_config).
    replicas = split_addresses(context.address)
    async with client_channel(replicas, tls=context.tls, asynchronous=True) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=args.connect_timeout)
        except TimeoutError:
            raise CliError(
                f"cannot reach the control plane at {context.address} within "
                f"{args.connect_timeout:g} s; no call was made (is `gantry up` running there?)"
            ) from None
        call = _call_factory(inference_pb2_grpc.InferenceStub(channel), args, metadata)
        progress = BenchProgressBar(sys.stderr)
        try:
            return await run_load(call, plan, on_progress=progress)
        finally:
            progress.close()


def bench(context: CommandContext, args: argparse.Namespace) -> int:
    _check_combination(args)
    plan = _plan(args)
    metadata = (
        bearer(read_secret(Path(args.key_file), what="client API key"))
        if args.key_file
        else context.client_metadata()
    )
    result = asyncio.run(_measure(context, args, metadata, plan))
    document = bench_document(args, plan, result)
    print(json.dumps(document) if args.json else render_report(document))
    if result.ok == 0 and set(result.outcomes) == {grpc.StatusCode.UNAVAILABLE.name}:
        # UNAVAILABLE without a reason is the transport's: the control plane went away.
        print(f"error: no call reached the control plane at {context.address}", file=sys.stderr)
        return 1
    return 0
