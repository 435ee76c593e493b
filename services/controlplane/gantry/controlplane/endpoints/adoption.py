"""AdoptEndpoint and ListEndpoints: external OpenAI-compatible servers as adopted deployments.

One adoption is one transaction: a new deployment (origin "adopted", no artifact set, one
replica, min = max = 1 so no autoscale) bound to its capability as CreateDeployment binds, the
endpoint with its sealed credential, and one residency pinned to the endpoint's node with a LOAD
job that names the server instead of an artifact. Committed first and announced after, as
everywhere in the lifecycle. A refusal (bad URL, one of this control plane's own listeners,
unknown or disabled node) stores nothing.

Gantry never starts, stops or signals the server: the worker only calls it, and an unload or a
delete forgets it. Nothing is ever adopted unasked: only this RPC creates an adopted residency.
"""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import dataclass

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError, invalid_argument
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.deployments.placement import queue_load
from gantry.controlplane.deployments.requirements import ResidencyCharge
from gantry.controlplane.deployments.residency_charges import read_charges
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.endpoints import store as endpoints
from gantry.controlplane.endpoints.url_rules import (
    OwnListeners,
    check_credential,
    check_endpoint_url,
    check_model_name,
    check_not_own_listener,
)
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import (
    ChargesLearned,
    DeploymentChanged,
    ResidenciesChanged,
    record,
)
from gantry.controlplane.platform.models import AdoptedEndpoint, Deployment, Node, Residency
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.state_machines import NodeState
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.platform.validation import _check_name
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp

# The adapter name an adopted deployment records: the worker reads LoadSpec.endpoint, never a
# runtime adapter, for it.
ADOPTED_ADAPTER = "adopted_openai_endpoint"
DEFAULT_MAX_CONCURRENCY = 8
MAX_CONCURRENCY = 1024


@dataclass(frozen=True)
class _Adopted:
    deployment: Deployment
    residency: Residency
    endpoint: AdoptedEndpoint
    charges: dict[str, ResidencyCharge]


@dataclass(frozen=True)
class _Adoption:
    """An adoption request, checked, with its credential sealed: what one attempt stores."""

    request: cp.AdoptEndpointRequest
    model: str
    has_credential: bool
    sealed: str
    adapter: common_pb2.AdapterSettings
    actor: str
    own: OwnListeners  # what the URL must not name


def _check_request(request: cp.AdoptEndpointRequest) -> tuple[str, str]:
    """The request's model and credential, checked; INVALID_ARGUMENT for any field that is not."""
    _check_name(request.capability, field="capability")
    model = check_model_name(request.model)
    credential = check_credential(request.credential)
    if not request.node:
        raise invalid_argument("node is required: the id or name of the node", field="node")
    if request.max_concurrency > MAX_CONCURRENCY:
        raise invalid_argument(
            f"max_concurrency must be at most {MAX_CONCURRENCY}", field="max_concurrency"
        )
    return model, credential


def _adopted_adapter(request: cp.AdoptEndpointRequest) -> common_pb2.AdapterSettings:
    return common_pb2.AdapterSettings(
        adapter=ADOPTED_ADAPTER,
        max_concurrency=request.max_concurrency or DEFAULT_MAX_CONCURRENCY,
        max_new_tokens=request.max_new_tokens,
    )


def _check_node_enabled(node: Node) -> None:
    if node.state == NodeState.DISABLED:
        raise GantryError(
            "NODE_DISABLED",
            f"node {node.node_id} is disabled; enable it before adopting a server there",
            node_id=node.node_id,
        )


async def _store_adoption(
    session: AsyncSession, adoption: _Adoption, *, now: dt.datetime
) -> _Adopted:
    """The deployment, its endpoint, binding, residency and LOAD job (the caller commits)."""
    request = adoption.request
    node = await endpoints.find_node(session, request.node)
    _check_node_enabled(node)
    url = check_endpoint_url(request.url, node_hostname=node.hostname)
    check_not_own_listener(url, node_hostname=node.hostname, own=adoption.own)
    row = await deployments.create_deployment(
        session,
        capability=request.capability,
        artifact_set_id=None,
        adapter=convert.adapter_to_json(adoption.adapter),
        environment_id="",
        replicas=1,
        now=now,
        origin=endpoints.ORIGIN_ADOPTED,
    )
    endpoint = await endpoints.create_endpoint(
        session,
        deployment_id=row.deployment_id,
        node_id=node.node_id,
        url=url.base,
        model=adoption.model,
        credential_sealed=adoption.sealed,
        now=now,
    )
    binding = await bindings.bind(
        session,
        capability=row.capability,
        deployment_id=row.deployment_id,
        serves_now=False,  # it serves once its worker reports it RESIDENT
        now=now,
    )
    residency = await deployments.create_residency(
        session, deployment_id=row.deployment_id, node_id=node.node_id, now=now
    )
    await queue_load(session, row, residency, now=now)
    await settle_deployment(session, row.deployment_id, now=now)
    bound_now = binding.deployment_id == row.deployment_id
    await _audit_adoption(session, adoption, row, endpoint, bound_now=bound_now, now=now)
    charges = await read_charges(session, [row.deployment_id])
    return _Adopted(row, residency, endpoint, charges)


async def _audit_adoption(
    session: AsyncSession,
    adoption: _Adoption,
    row: Deployment,
    endpoint: AdoptedEndpoint,
    *,
    bound_now: bool,
    now: dt.datetime,
) -> None:
    await audit.record_event(
        session,
        actor=adoption.actor,
        action="capability.bind",
        subject_kind="capability",
        subject_id=row.capability,
        now=now,
        deployment_id=row.deployment_id,
        bound_now=str(bound_now),
    )
    # The URL carries no secret (checked); the credential is only said to exist.
    await audit.record_event(
        session,
        actor=adoption.actor,
        action="endpoint.adopt",
        subject_kind="endpoint",
        subject_id=endpoint.endpoint_id,
        now=now,
        deployment_id=row.deployment_id,
        node_id=endpoint.node_id,
        url=endpoint.url,
        model=adoption.model,
        capability=row.capability,
        has_credential=str(adoption.has_credential).lower(),
    )


class EndpointAdoption:
    def __init__(self, *, database: Database, lifecycle: DeploymentLifecycle, clock: Clock):
        self._database = database
        self._lifecycle = lifecycle
        self._clock = clock
        # Told once the listeners are bound (`AdoptedEndpointRpcs.listening_on`, app.py).
        self.own_listeners = OwnListeners()

    async def adopt(
        self, request: cp.AdoptEndpointRequest, *, actor: str
    ) -> tuple[Deployment, Residency, AdoptedEndpoint]:
        model, credential = _check_request(request)
        # Sealed before the transaction: a retried attempt stores the same sealed value.
        sealed = self._lifecycle.sealer.seal(credential)
        adoption = _Adoption(
            request=request,
            model=model,
            has_credential=bool(credential),
            sealed=sealed,
            adapter=_adopted_adapter(request),
            actor=actor,
            own=self.own_listeners,
        )

        async def attempt() -> _Adopted:
            now = self._clock.now()
            async with self._database.transaction() as session:
                adopted = await _store_adoption(session, adoption, now=now)
                record(
                    session,
                    DeploymentChanged(adopted.deployment),
                    # Zero bytes (no profile, nothing in Gantry's custody) and its slots:
                    # announced with the residency, which the scheduler then routes to like any
                    # other.
                    ChargesLearned(adopted.charges),
                    ResidenciesChanged((adopted.residency,)),
                )
            return adopted

        adopted = await retry_on_conflict(attempt)
        await self._lifecycle.dispatch_queued(adopted.residency.node_id)
        return adopted.deployment, adopted.residency, adopted.endpoint

    async def residency_message(
        self, residency_id: str, endpoint: AdoptedEndpoint
    ) -> common_pb2.Residency:
        async with self._database.transaction() as session:
            residency = await deployments.get_residency(session, residency_id)
            deployment = await deployments.get_deployment(session, residency.deployment_id)
        message = convert.residency(residency)
        message.adopted = True
        message.endpoint.CopyFrom(endpoint_message(endpoint, deployment, residency))
        return message

    async def list(self, request: cp.ListEndpointsRequest) -> cp.ListEndpointsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await endpoints.list_endpoints(
                session,
                after=page.after,
                limit=page.fetch,
                include_deleted=request.include_deleted,
            )
            items, next_token = page.split(rows, key=lambda row: row.endpoint_id)
            messages = []
            for row in items:
                deployment = await deployments.get_deployment(session, row.deployment_id)
                placed = await deployments.residencies_of(session, row.deployment_id)
                messages.append(endpoint_message(row, deployment, placed[0] if placed else None))
        return cp.ListEndpointsResponse(endpoints=messages, next_page_token=next_token)


def own_listeners(*ports: int | None) -> OwnListeners:
    """This control plane's bound ports (None or 0: a listener not opened) on this machine, named
    as a worker here names it in Hello (socket.gethostname())."""
    return OwnListeners(
        ports=frozenset(port for port in ports if port), hostname=socket.gethostname()
    )


def endpoint_message(
    row: AdoptedEndpoint, deployment: Deployment, residency: Residency | None
) -> common_pb2.AdoptedEndpoint:
    """The endpoint as operators see it: never its credential, only whether one is stored."""
    message = common_pb2.AdoptedEndpoint(
        endpoint_id=row.endpoint_id,
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        url=row.url,
        model=row.model,
        has_credential=bool(row.credential_sealed),
        created_at=convert.timestamp(row.created_at),
        deleted_at=convert.timestamp(row.deleted_at),
        capability=deployment.capability,
    )
    if residency is not None:
        message.state = convert.residency(residency).state
    return message


class AdoptedEndpointRpcs:
    """Mixed into ControlPlaneService."""

    _endpoint_adoption: EndpointAdoption

    def listening_on(self, own: OwnListeners) -> None:
        """Where this control plane listens, once bound: AdoptEndpoint refuses those."""
        self._endpoint_adoption.own_listeners = own

    async def AdoptEndpoint(
        self, request: cp.AdoptEndpointRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Residency:
        _, residency, endpoint = await self._endpoint_adoption.adopt(
            request, actor=current_principal().subject
        )
        return await self._endpoint_adoption.residency_message(residency.residency_id, endpoint)

    async def ListEndpoints(
        self, request: cp.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListEndpointsResponse:
        return await self._endpoint_adoption.list(request)
