"""Who may call what: the role each service requires and the principal a request runs as."""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gantry.common.errors import GantryError


class Role(enum.Enum):
    OPERATOR = "operator"
    CLIENT = "client"
    WORKER = "worker"
    SERVICE = "service"


# Method prefix -> required role. Health and reflection stay open so operators can discover
# services with grpcurl and orchestrators can probe them without a secret.
SERVICE_ROLES: dict[str, Role] = {
    "/gantry.v1.ControlPlane/": Role.OPERATOR,
    "/gantry.v1.Inference/": Role.CLIENT,
    # The Open Inference Protocol (KServe v2 / Triton) beside it: the same keys, the same tenant.
    "/inference.GRPCInferenceService/": Role.CLIENT,
    "/gantry.v1.WorkerGateway/": Role.WORKER,
    "/gantry.v1.Scheduler/": Role.SERVICE,
}
OPEN_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
    # KServe v2's liveness, readiness and server metadata, open as Triton's are: load balancers
    # and orchestrators probe them without a key. They say nothing about models or tenants.
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/inference.GRPCInferenceService/ServerMetadata",
)


@dataclass(frozen=True, slots=True)
class Principal:
    role: Role
    subject: str  # operator token id, tenant id, node id, service name


class Authenticator(Protocol):
    async def authenticate(self, role: Role, token: str) -> Principal: ...


_current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "gantry_principal", default=None
)


def current_principal() -> Principal:
    principal = _current_principal.get()
    if principal is None:
        raise GantryError("UNAUTHENTICATED", "no authenticated principal for this call")
    return principal


def set_principal(principal: Principal | None) -> contextvars.Token[Principal | None]:
    return _current_principal.set(principal)


def required_role(method: str) -> Role | None:
    """The role a method needs; None for open methods. Unknown methods need an impossible role."""
    if method.startswith(OPEN_PREFIXES):
        return None
    for prefix, role in SERVICE_ROLES.items():
        if method.startswith(prefix):
            return role
    raise GantryError("PERMISSION_DENIED", f"method {method} is not served", method=method)


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    raise GantryError("UNAUTHENTICATED", "missing 'authorization: Bearer <token>' metadata")


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def authenticate_bearer(
    authenticator: Authenticator,
    role: Role,
    metadata: Sequence[tuple[str, str | bytes]] | None,
) -> Principal:
    """The caller's principal from its `authorization: Bearer <token>`: the one check every front
    door makes (the gRPC interceptor with the call's metadata, the HTTP API with its headers)."""
    return await authenticator.authenticate(role, bearer_token(metadata))
