"""Which deployment a request reaches: the one its capability's binding names, or the one it names.

Routing by capability reads the binding only: the bound deployment if it is routable (READY or
DEGRADED), else DEPLOYMENT_NOT_READY (UNAVAILABLE: it is on its way) or, for one that will not come
back by itself (UNLOADING, UNLOADED, FAILED), DEPLOYMENT_NOT_SERVING (FAILED_PRECONDITION: retrying
cannot help); never another deployment of the capability. No binding at all is NOT_FOUND. A
deployment made without an approval is reached only where this control plane allows unapproved
deployments (the legacy path kept for tests).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gantry.common.errors import GantryError, excerpt, invalid_argument
from gantry.common.ids import parse_id
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import Deployment
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.v1 import inference_pb2

log = logging.getLogger(__name__)

ROUTABLE_DEPLOYMENT_STATES = frozenset({DeploymentState.READY, DeploymentState.DEGRADED})
# States no deployment leaves for a serving one (a FAILED deployment is not retried): only the
# operator can help, by deploying again.
STOPPED_DEPLOYMENT_STATES = frozenset(
    {DeploymentState.UNLOADING, DeploymentState.UNLOADED, DeploymentState.FAILED}
)


# The inference requests with the `target` oneof (capability | deployment_id).
TargetedRequest = (
    inference_pb2.EmbedRequest
    | inference_pb2.RerankRequest
    | inference_pb2.TranscribeRequest
    | inference_pb2.RecognizeTextRequest
    | inference_pb2.EmbedImageRequest
    | inference_pb2.ClassifyImageRequest
    | inference_pb2.GenerateRequest
)


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """A routable deployment and its capability, as stored: a binding names only deployments of
    its own capability (every bind takes the deployment row's), so a call by capability resolves
    to the capability it named and a call by deployment id to the deployment's."""

    deployment_id: str
    capability: str


class DeploymentResolver:
    def __init__(self, *, database: Database, routes: RouteCache) -> None:
        self._database = database
        self._routes = routes
        # capability -> (epoch, the binding read in flight). Concurrent misses share one read
        # instead of each opening a transaction: when an entry expires under load, every caller
        # of that capability misses at the same moment.
        self._reads: dict[str, tuple[int, asyncio.Future[str]]] = {}
        # Routes read again before they expire (route_cache.py), held until each ends.
        self._refreshes: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Stop the refreshes still reading (the control plane stops, its database closes)."""
        for task in list(self._refreshes):
            task.cancel()
        await asyncio.gather(*self._refreshes, return_exceptions=True)

    async def resolve(self, request: TargetedRequest) -> str:
        """capability | deployment_id -> a routable deployment id, or a typed reason why not.

        READY and DEGRADED deployments are routable (a degraded one still has residents; the
        scheduler picks only RESIDENT residencies and answers DEPLOYMENT_NOT_READY if none is).
        """
        return (await self.resolve_target(request)).deployment_id

    async def resolve_target(self, request: TargetedRequest) -> ResolvedTarget:
        """`resolve`, with the deployment's capability (what its calls are labelled with)."""
        target = request.WhichOneof("target")
        if target == "capability" and request.capability:
            deployment_id = await self._by_capability(request.capability)
            return ResolvedTarget(deployment_id, request.capability)
        if target == "deployment_id":
            deployment_id = parse_id(request.deployment_id, field="deployment_id")
            async with self._database.read() as session:
                deployment = await deployments.get_live_deployment(session, deployment_id)
            routable = self._routable(deployment, name=f"deployment {deployment_id}")
            return ResolvedTarget(routable, deployment.capability)
        raise invalid_argument("set capability or deployment_id", field="target")

    async def _by_capability(self, capability: str) -> str:
        while True:
            if cached := self._routes.get(capability):
                if capability not in self._reads and self._routes.refresh_due(capability):
                    self._refresh(capability)
                return cached
            shared = self._reads.get(capability)
            # Only a read started in the current epoch may answer: one started before a clear
            # (or a binding move) could name the old deployment.
            if shared is None or not self._routes.current(shared[0]):
                return await self._read_shared(capability)
            try:
                return await asyncio.shield(shared[1])
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this caller was cancelled
                # The reader was cancelled, not us: read again.

    def _refresh(self, capability: str) -> None:
        task = asyncio.create_task(self._read_ahead(capability), name="route-refresh")
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def _read_ahead(self, capability: str) -> None:
        try:
            await self._read_shared(capability)
        except Exception as error:  # the call that needs the route is told, not this one
            # Unbound, no longer routable, or the database away: the entry is dropped, so the
            # next call reads the binding itself and gets the typed reason.
            self._routes.drop(capability)
            log.debug("route of capability %r not refreshed: %s", excerpt(capability), error)

    async def _read_shared(self, capability: str) -> str:
        epoch = self._routes.epoch
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Followers may be none: mark the outcome retrieved so it is never logged as lost.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._reads[capability] = (epoch, future)
        try:
            deployment_id = await self._read_binding(capability, epoch)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(deployment_id)
            return deployment_id
        finally:
            if self._reads.get(capability, (None, None))[1] is future:
                del self._reads[capability]

    async def _read_binding(self, capability: str, epoch: int) -> str:
        name = f"capability {excerpt(capability)!r}"  # a caller's text: echoed bounded
        async with self._database.read() as session:
            binding = await bindings.get_binding(session, capability)
            if binding is None:
                raise GantryError(
                    "NOT_FOUND", f"no deployment is bound to {name}", capability=capability
                )
            if binding.deployment_id is None:
                raise GantryError(
                    "DEPLOYMENT_NOT_READY",
                    f"{name} waits for deployment {binding.pending_deployment_id} to be READY",
                    capability=capability,
                )
            deployment = await deployments.get_deployment(session, binding.deployment_id)
        deployment_id = self._routable(
            deployment, name=f"{name} (deployment {deployment.deployment_id})"
        )
        self._routes.put(capability, deployment_id, epoch=epoch)
        return deployment_id

    def _routable(self, deployment: Deployment, *, name: str) -> str:
        if deployment.approval_id is None and deployment.origin != ORIGIN_ADOPTED:
            # Only a row from before the evidence pipeline (schema 0003) can lack one. An adopted
            # endpoint has none by nature: the operator's audited AdoptEndpoint is its gate.
            raise GantryError(
                "NOT_APPROVED",
                f"{name} was made without an approval and is not routed",
                deployment_id=deployment.deployment_id,
            )
        if deployment.state in STOPPED_DEPLOYMENT_STATES:
            # The failure itself is the operator's to read (GetDeployment), not every client's.
            raise GantryError(
                "DEPLOYMENT_NOT_SERVING",
                f"{name} is {deployment.state} and will not serve again; retrying cannot help:"
                " deploy the model again (or bind the capability to a serving deployment)",
                deployment_id=deployment.deployment_id,
                state=str(deployment.state),
            )
        if deployment.state not in ROUTABLE_DEPLOYMENT_STATES:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"{name} is {deployment.state}",
                deployment_id=deployment.deployment_id,
            )
        return deployment.deployment_id
