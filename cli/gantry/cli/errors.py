"""How the CLI reports failures: one line on stderr, never a traceback."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from gantry.common.errors import ERROR_DOMAIN, GantryError


class CliError(Exception):
    """A failure the CLI explains in one line and exits 1 for."""


def error_reason(error: grpc.RpcError) -> str | None:
    """The ErrorInfo reason from a rich gRPC status; None when the server sent none."""
    # AioRpcError (what `gantry bench` sees) is no grpc.Call but has the same code, details and
    # trailing metadata, which is all from_call reads.
    if not isinstance(error, grpc.Call | grpc.aio.AioRpcError):
        return None
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        # A trailer whose code or message disagrees with the call: not trustworthy, ignore it.
        return None
    if status is None:
        return None
    fallback: str | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return info.reason
            fallback = fallback or info.reason
    return fallback


def format_rpc_error(error: grpc.RpcError, *, address: str | None = None) -> str:
    """`error: <CODE> <reason>: <message>` for a failed call."""
    code = error.code() if isinstance(error, grpc.Call) else None
    message = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    message = " ".join(message.split())  # one line, whatever the server put in it
    code_name = code.name if code is not None else "UNKNOWN"
    reason = error_reason(error)
    # A reason that only repeats the code (NOT_FOUND NOT_FOUND) is said once.
    head = (
        f"error: {code_name} {reason}" if reason and reason != code_name else f"error: {code_name}"
    )
    line = f"{head}: {message}"
    if code == grpc.StatusCode.UNAVAILABLE and reason is None and address is not None:
        # Almost always nothing listening: say what to do rather than only what failed.
        line += f" (is `gantry up` running at {address}?)"
    return line


def format_gantry_error(error: GantryError) -> str:
    """A typed error raised locally (e.g. while hashing an artifact), in the same shape."""
    if error.reason == error.code.name:
        return f"error: {error.code.name}: {error.message}"
    return f"error: {error.code.name} {error.reason}: {error.message}"
