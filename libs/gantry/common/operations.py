"""Every inference operation, declared once: the one table each layer dispatches on.

An operation is one `gantry.v1.Inference` RPC. Its entry names what every layer needs to find it:
the RPC (also the `operation`/`method` label of every metric, unchanged), the oneof field that
carries it through the worker's `Invoke` and the model host's `HostRequest` (`kind`), the field
its answer comes back in (`result_kind`: an image embedding answers as an embedding does), the
message types at each hop, the control plane's span, whether it streams, and the CLI verb.

This is data, not behaviour: how the control plane checks and shapes a call lives in
`gantry.controlplane.serving.operations`, how a model host runs one in its adapter's method named
`kind`. Adding an operation is one entry here; docs/contributing.md lists the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One inference RPC and the names it travels under through the fleet."""

    rpc: str  # gantry.v1.Inference's method; the metrics' `operation`/`method` label
    kind: str  # the field of Invoke.payload and HostRequest.kind that carries it
    result_kind: str  # the field of InvokeResult.outcome and HostResponse.kind that answers it
    payload_type: type[Message]  # the worker payload (worker_gateway.proto)
    result_type: type[Message]  # the worker result (worker_gateway.proto)
    request_type: type[Message]  # the client's request (inference.proto)
    response_type: type[Message]  # the client's response, or each streamed chunk
    span_name: str  # the control plane's span around one call
    # The RPC answers with a stream; its worker sends InvokeProgress before the result, asked
    # for by the payload's own `stream` flag (so one payload type may serve two RPCs).
    streaming: bool = False
    cli_verb: str = ""  # the `gantry` command that calls it ("" when none does)
    cli_help: str = ""  # that command's one-line help


def _operation(
    rpc: str,
    kind: str,
    *,
    payload: type[Message],
    result: type[Message],
    request: type[Message],
    response: type[Message],
    result_kind: str = "",
    span: str = "",
    streaming: bool = False,
    cli: tuple[str, str] = ("", ""),
) -> Operation:
    """An entry whose answer comes in the field named as its kind and whose span is named
    after it, unless told otherwise."""
    return Operation(
        rpc=rpc,
        kind=kind,
        result_kind=result_kind or kind,
        payload_type=payload,
        result_type=result,
        request_type=request,
        response_type=response,
        span_name=f"controlplane.{span or kind}",
        streaming=streaming,
        cli_verb=cli[0],
        cli_help=cli[1],
    )


EMBED = _operation(
    "Embed",
    "embed",
    payload=wg.EmbedPayload,
    result=wg.EmbedResult,
    request=inference_pb2.EmbedRequest,
    response=inference_pb2.EmbedResponse,
    cli=("embed", "embed texts with the local client key"),
)
RERANK = _operation(
    "Rerank",
    "rerank",
    payload=wg.RerankPayload,
    result=wg.RerankResult,
    request=inference_pb2.RerankRequest,
    response=inference_pb2.RerankResponse,
)
TRANSCRIBE = _operation(
    "Transcribe",
    "transcribe",
    payload=wg.TranscribePayload,
    result=wg.TranscribeResult,
    request=inference_pb2.TranscribeRequest,
    response=inference_pb2.TranscribeResponse,
    cli=("transcribe", "transcribe one audio clip (Transcribe)"),
)
RECOGNIZE_TEXT = _operation(
    "RecognizeText",
    "recognize_text",
    payload=wg.RecognizeTextPayload,
    result=wg.RecognizeTextResult,
    request=inference_pb2.RecognizeTextRequest,
    response=inference_pb2.RecognizeTextResponse,
    cli=("ocr", "read the line of text in each image (RecognizeText)"),
)
EMBED_IMAGE = _operation(
    "EmbedImage",
    "embed_image",
    payload=wg.EmbedImagePayload,
    result=wg.EmbedResult,
    result_kind="embed",
    request=inference_pb2.EmbedImageRequest,
    response=inference_pb2.EmbedResponse,
    cli=("embed-image", "embed images with the local client key (EmbedImage)"),
)
CLASSIFY_IMAGE = _operation(
    "ClassifyImage",
    "classify_image",
    payload=wg.ClassifyImagePayload,
    result=wg.ClassifyImageResult,
    request=inference_pb2.ClassifyImageRequest,
    response=inference_pb2.ClassifyImageResponse,
    cli=("classify", "score each image against labels (ClassifyImage)"),
)
# One verb for both generation RPCs: it streams unless asked not to.
_GENERATE_CLI = ("generate", "generate text from a prompt (GenerateStream, Generate)")
GENERATE = _operation(
    "Generate",
    "generate",
    payload=wg.GeneratePayload,
    result=wg.GenerateResult,
    request=inference_pb2.GenerateRequest,
    response=inference_pb2.GenerateResponse,
    cli=_GENERATE_CLI,
)
GENERATE_STREAM = _operation(
    "GenerateStream",
    "generate",
    payload=wg.GeneratePayload,
    result=wg.GenerateResult,
    request=inference_pb2.GenerateRequest,
    response=inference_pb2.GenerateChunk,
    span="generate_stream",
    streaming=True,
    cli=_GENERATE_CLI,
)

# Every operation, in the order inference.proto declares its RPC.
OPERATIONS: Sequence[Operation] = (
    EMBED,
    RERANK,
    TRANSCRIBE,
    RECOGNIZE_TEXT,
    EMBED_IMAGE,
    CLASSIFY_IMAGE,
    GENERATE,
    GENERATE_STREAM,
)
BY_RPC: Mapping[str, Operation] = {operation.rpc: operation for operation in OPERATIONS}
# The kinds a worker and a model host carry: one per payload, whichever RPC sent it.
KINDS: frozenset[str] = frozenset(operation.kind for operation in OPERATIONS)
# The kinds whose answer may be preceded by progress (a streamed generation's deltas).
STREAMING_KINDS: frozenset[str] = frozenset(
    operation.kind for operation in OPERATIONS if operation.streaming
)


def _first_of_each(key: str) -> Mapping[object, Operation]:
    table: dict[object, Operation] = {}
    for operation in OPERATIONS:
        table.setdefault(getattr(operation, key), operation)
    return table


# kind -> its (first, unary) operation; payload type -> the same. A kind two RPCs share (a
# generation) differs only in `streaming`, which `of_payload` reads from the payload.
_BY_KIND = _first_of_each("kind")
_BY_PAYLOAD_TYPE = _first_of_each("payload_type")


def by_rpc(rpc: str) -> Operation:
    """The operation of an Inference method. KeyError for one that is not an operation."""
    return BY_RPC[rpc]


def by_kind(kind: str) -> Operation:
    """The (unary) operation carried as `kind`. KeyError for a kind no operation has."""
    return _BY_KIND[kind]


def of_payload(payload: Message) -> Operation:
    """The RPC a worker payload is sent for: by its type, and where two RPCs share it, by
    whether it asks to stream. KeyError for a message that is no operation's payload."""
    operation = _BY_PAYLOAD_TYPE[type(payload)]
    if getattr(payload, "stream", False):
        return next(
            (
                candidate
                for candidate in OPERATIONS
                if candidate.kind == operation.kind and candidate.streaming
            ),
            operation,
        )
    return operation


def cli_verbs() -> Mapping[str, tuple[str, tuple[Operation, ...]]]:
    """CLI verb -> (its help, the operations it calls), each verb once, in declaration order."""
    verbs: dict[str, tuple[str, tuple[Operation, ...]]] = {}
    for operation in OPERATIONS:
        if operation.cli_verb:
            help_text, operations = verbs.get(operation.cli_verb, (operation.cli_help, ()))
            verbs[operation.cli_verb] = (help_text, (*operations, operation))
    return verbs
