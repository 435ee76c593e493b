"""Gantry's typed errors: a CONTRACTS.md reason, a failure class and the gRPC code it maps to."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from gantry.v1 import common_pb2

ERROR_DOMAIN = "gantry.dev"
CLIENT_MESSAGE_LIMIT = 300
# What of a caller's text (a model name, a field's value) an error echoes: enough to recognise it.
# A status travels in gRPC trailers (8 KiB at most by default): a 1 MiB name echoed whole made the
# trailer too large, and the client got RESOURCE_EXHAUSTED without the ErrorInfo.
EXCERPT_CHARS = 120
# Every ErrorInfo metadata value is bounded (ids, limits and names are far shorter).
METADATA_VALUE_CHARS = 256


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` when it is at most `limit` characters, else its first `limit` and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


class FailureClass(enum.Enum):
    INFRA = common_pb2.FAILURE_CLASS_INFRA
    REQUEST = common_pb2.FAILURE_CLASS_REQUEST
    CONFIG = common_pb2.FAILURE_CLASS_CONFIG


@dataclass(frozen=True, slots=True)
class ReasonSpec:
    code: grpc.StatusCode
    failure_class: FailureClass


# One table: every reason, the status code clients see and how the failure counts.
REASONS: Mapping[str, ReasonSpec] = {
    "ARTIFACT_PATH_INVALID": ReasonSpec(grpc.StatusCode.INVALID_ARGUMENT, FailureClass.REQUEST),
    "ARTIFACT_MISMATCH": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    "RUNTIME_INCOMPATIBLE": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    "RUNTIME_ENVIRONMENT_UNAVAILABLE": ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG
    ),
    "LOAD_FAILED": ReasonSpec(grpc.StatusCode.INTERNAL, FailureClass.INFRA),
    # A LOAD answered with evidence that is not what the job asked for (another manifest digest,
    # other verified counts, no known isolation): INFRA, retried like a failed load, so an honest
    # worker's next attempt can still load it.
    "LOAD_EVIDENCE_MISMATCH": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.INFRA),
    "HEALTH_FAILED": ReasonSpec(grpc.StatusCode.INTERNAL, FailureClass.INFRA),
    "INVOKE_FAILED": ReasonSpec(grpc.StatusCode.INTERNAL, FailureClass.INFRA),
    "RECLAIM_UNVERIFIED": ReasonSpec(grpc.StatusCode.INTERNAL, FailureClass.INFRA),
    "RUNTIME_CRASHED": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "RUNTIME_CRASH_LOOP": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "RUNTIME_OOM_KILLED": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    # CUDA out of memory in the model host (torch.cuda.OutOfMemoryError), never the kernel's
    # OOM killer. At load: the envelope was wrong for this model (CONFIG: a retry cannot fit).
    # At invoke: the request's size against the envelope; the host released its cache and
    # serves on, so no breaker counts it (it answered), while the degradation signal does
    # (CONFIG: the deployment, not the client, has to change for such calls to succeed).
    "RUNTIME_OOM": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.CONFIG),
    "INVOKE_OOM": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.CONFIG),
    "RUNTIME_UNRESPONSIVE": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "LEASE_EXPIRED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.INFRA),
    "LEASE_TOKEN_INVALID": ReasonSpec(grpc.StatusCode.PERMISSION_DENIED, FailureClass.INFRA),
    "STALE_GENERATION": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.INFRA),
    "NODE_DISABLED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    "NOT_APPROVED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    "DEPLOYMENT_NOT_READY": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    # Unloaded, unloading or FAILED: it will not come back by itself, so retrying cannot help.
    "DEPLOYMENT_NOT_SERVING": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    # A call still running on a draining residency when its drain deadline passed: the
    # operator's drain (or a scale down) ended it, not the runtime, so it opens no breaker and
    # degrades nothing (REQUEST); another replica, or the same call later, may serve it.
    "DRAIN_DEADLINE_EXCEEDED": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.REQUEST),
    "NO_ELIGIBLE_NODE": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    # A CUDA profile with neither a VRAM estimate nor a measured peak: placing it would charge
    # its GPU nothing, so it is not placed until one is known.
    "VRAM_UNMEASURED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.CONFIG),
    "NO_CAPACITY": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.INFRA),
    "QUEUE_FULL": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.INFRA),
    "TENANT_QUOTA_EXCEEDED": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.REQUEST),
    # A streaming caller that reads slower than its model writes, past the bounded backlog: the
    # client's doing, never the runtime's (no breaker counts it).
    "CLIENT_TOO_SLOW": ReasonSpec(grpc.StatusCode.RESOURCE_EXHAUSTED, FailureClass.REQUEST),
    "BUDGET_EXCEEDED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST),
    "CIRCUIT_OPEN": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "INVALID_PAYLOAD": ReasonSpec(grpc.StatusCode.INVALID_ARGUMENT, FailureClass.REQUEST),
    # An empty text, or one past the model's token limit without truncate: the client's input,
    # never the runtime's failure (no breaker, no crash accounting, no degradation).
    "EMPTY_INPUT": ReasonSpec(grpc.StatusCode.INVALID_ARGUMENT, FailureClass.REQUEST),
    "INPUT_TOO_LONG": ReasonSpec(grpc.StatusCode.INVALID_ARGUMENT, FailureClass.REQUEST),
    # Deletes refused while something still uses the object, and new work on a deleted set.
    "ARTIFACT_SET_IN_USE": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST),
    "ARTIFACT_SET_DELETED": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST),
    "NODE_IN_USE": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST),
    # Deleting a deployment that still runs somewhere; any work naming a deleted one (it is gone
    # for new work, so NOT_FOUND, while GetDeployment still shows it with deleted_at).
    "DEPLOYMENT_IN_USE": ReasonSpec(grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST),
    "DEPLOYMENT_DELETED": ReasonSpec(grpc.StatusCode.NOT_FOUND, FailureClass.REQUEST),
    "INVALID_STATE_TRANSITION": ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION, FailureClass.REQUEST
    ),
    # Reasons for the generic cases every API has.
    "INVALID_ARGUMENT": ReasonSpec(grpc.StatusCode.INVALID_ARGUMENT, FailureClass.REQUEST),
    "NOT_FOUND": ReasonSpec(grpc.StatusCode.NOT_FOUND, FailureClass.REQUEST),
    "ALREADY_EXISTS": ReasonSpec(grpc.StatusCode.ALREADY_EXISTS, FailureClass.REQUEST),
    "UNAUTHENTICATED": ReasonSpec(grpc.StatusCode.UNAUTHENTICATED, FailureClass.REQUEST),
    "PERMISSION_DENIED": ReasonSpec(grpc.StatusCode.PERMISSION_DENIED, FailureClass.REQUEST),
    # A method of a public protocol Gantry speaks but does not serve (a Triton repository load,
    # shared memory): the `served` metadata lists the methods it does serve.
    "UNIMPLEMENTED": ReasonSpec(grpc.StatusCode.UNIMPLEMENTED, FailureClass.REQUEST),
    "SCHEDULER_UNAVAILABLE": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "WORKER_UNAVAILABLE": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    # The control plane's database refused or could not take the transaction in time (locked,
    # read-only, unreachable, out of disk): nothing was written, and the same call may succeed.
    "STORE_UNAVAILABLE": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    # A control-plane replica's decision (placement, the reconciler's writes) refused by the
    # fencing epoch: another replica took the leader's lock; nothing of it was written.
    "NOT_LEADER": ReasonSpec(grpc.StatusCode.UNAVAILABLE, FailureClass.INFRA),
    "DEADLINE_EXCEEDED": ReasonSpec(grpc.StatusCode.DEADLINE_EXCEEDED, FailureClass.INFRA),
    "RESULT_CONFLICT": ReasonSpec(grpc.StatusCode.ABORTED, FailureClass.INFRA),
    "INTERNAL": ReasonSpec(grpc.StatusCode.INTERNAL, FailureClass.INFRA),
}


class GantryError(Exception):
    """A failure with a reason. Raised by domain code; mapped to gRPC once, by the interceptor."""

    def __init__(self, reason: str, message: str, **metadata: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown error reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message
        # Bounded here, once: metadata often carries what the caller sent (a name, an id).
        self.metadata: dict[str, str] = {
            key: excerpt(value, METADATA_VALUE_CHARS) for key, value in metadata.items()
        }

    @property
    def code(self) -> grpc.StatusCode:
        return REASONS[self.reason].code

    @property
    def failure_class(self) -> FailureClass:
        return REASONS[self.reason].failure_class

    def to_failure(self) -> common_pb2.Failure:
        return common_pb2.Failure(
            reason=self.reason,
            message=self.message,
            failure_class=self.failure_class.value,
            metadata=self.metadata,
        )

    @classmethod
    def from_failure(cls, failure: common_pb2.Failure) -> GantryError:
        reason = failure.reason if failure.reason in REASONS else "INTERNAL"
        return cls(reason, failure.message or reason, **dict(failure.metadata))

    @classmethod
    def for_client(cls, failure: common_pb2.Failure) -> GantryError:
        """Another process's failure as a client may see it: the reason and a short first line.

        A model host's failure message carries its stderr tail (for operators and logs); it must
        not reach whichever client's request happened to fail.
        """
        error = cls.from_failure(failure)
        first_line = error.message.splitlines()[0] if error.message else error.reason
        first_line = first_line.split("; stderr tail:")[0]
        if len(first_line) > CLIENT_MESSAGE_LIMIT:
            first_line = first_line[: CLIENT_MESSAGE_LIMIT - 1] + "…"
        return cls(error.reason, first_line, **error.metadata)

    def __repr__(self) -> str:
        return f"GantryError({self.reason}: {self.message})"


def invalid_argument(message: str, **metadata: str) -> GantryError:
    return GantryError("INVALID_ARGUMENT", message, **metadata)


def not_found(kind: str, ident: str) -> GantryError:
    return GantryError("NOT_FOUND", f"{kind} {excerpt(ident)!r} not found", kind=kind, id=ident)
