"""GantryError <-> gRPC rich status (google.rpc.Status with exactly one ErrorInfo)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gantry.common.errors import (
    ERROR_DOMAIN,
    METADATA_VALUE_CHARS,
    REASONS,
    GantryError,
    excerpt,
)

# What a status message may take of the trailer, as gRPC writes it (grpc-message percent-encodes
# every byte that is not printable ASCII, three bytes each); the message travels a second time,
# base64, in the ErrorInfo's status. Together with the bounded metadata this keeps the trailer
# well under gRPC's 8 KiB metadata limit, past which the client gets RESOURCE_EXHAUSTED instead.
WIRE_MESSAGE_BYTES = 2048
_NOTE_BYTES = 40  # "… (N characters)", the ellipsis percent-encoded


def wire_message(message: str, budget: int = WIRE_MESSAGE_BYTES) -> str:
    """`message` cut (with its length said) so that its percent-encoding takes at most `budget`
    bytes. A backstop: the places that echo a caller's text excerpt it already."""
    cost, cut = 0, 0
    for index, char in enumerate(message):
        printable = " " <= char <= "~" and char != "%"
        cost += 1 if printable else 3 * len(char.encode("utf-8", errors="surrogatepass"))
        if cost <= budget - _NOTE_BYTES:
            cut = index + 1  # the longest head that leaves room for the length note
        elif cost > budget:
            return f"{message[:cut]}… ({len(message)} characters)"
    return message


def to_rich_status(error: GantryError) -> grpc.Status:
    """The status for `error`, bounded to fit gRPC's trailers (its message cut by `wire_message`,
    each metadata value by METADATA_VALUE_CHARS, also where a caller set one after construction).
    """
    metadata = {key: excerpt(value, METADATA_VALUE_CHARS) for key, value in error.metadata.items()}
    info = error_details_pb2.ErrorInfo(
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={**metadata, "failure_class": error.failure_class.name},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    message = wire_message(error.message)
    return rpc_status.to_status(
        status_pb2.Status(code=error.code.value[0], message=message, details=[detail])
    )


def error_info_of(call: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo a server attached, if any (client side)."""
    try:
        status = rpc_status.from_call(call)  # type: ignore[arg-type]
    except ValueError:
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def error_from_rpc(call: grpc.RpcError) -> GantryError:
    """Rebuild the server's GantryError on the client; an untyped failure keeps its code's name."""
    info = error_info_of(call)
    message = call.details() if hasattr(call, "details") else str(call)  # type: ignore[attr-defined]
    if info is not None and info.reason in REASONS:
        metadata = {k: v for k, v in info.metadata.items() if k != "failure_class"}
        return GantryError(info.reason, message or info.reason, **metadata)
    code = call.code() if hasattr(call, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return GantryError("WORKER_UNAVAILABLE", message or "unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GantryError("DEADLINE_EXCEEDED", message or "deadline exceeded")
    return GantryError("INTERNAL", f"{code.name}: {message}")
