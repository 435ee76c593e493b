"""Open worker streams: one session per connected node generation, and invocations over them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerSession:
    """One worker generation's stream. Closing it fails whatever still waits on it."""

    node_id: str
    generation: int
    outbox: asyncio.Queue[wg.ControlMessage | None] = field(default_factory=asyncio.Queue)
    pending_invokes: dict[str, asyncio.Future[wg.InvokeResult]] = field(default_factory=dict)
    closed: bool = False

    def send(self, message: wg.ControlMessage) -> None:
        if self.closed:
            raise GantryError("WORKER_UNAVAILABLE", f"node {self.node_id} is not connected")
        self.outbox.put_nowait(message)

    def close(self, error: GantryError) -> None:
        if self.closed:
            return
        self.closed = True
        self.outbox.put_nowait(None)
        for future in self.pending_invokes.values():
            if not future.done():
                future.set_exception(error)

    def resolve_invoke(self, result: wg.InvokeResult) -> None:
        future = self.pending_invokes.get(result.request_id)
        if future is not None and not future.done():
            future.set_result(result)


class WorkerHub:
    """node id -> the current session. A newer generation replaces (and fences) the older one."""

    def __init__(self) -> None:
        self._sessions: dict[str, WorkerSession] = {}

    def attach(self, session: WorkerSession) -> None:
        previous = self._sessions.get(session.node_id)
        if previous is not None and previous is not session:
            previous.close(
                GantryError(
                    "STALE_GENERATION",
                    f"node {session.node_id} reconnected as generation {session.generation}",
                )
            )
        self._sessions[session.node_id] = session

    def detach(self, session: WorkerSession) -> bool:
        """Forget the session if it is still the current one; True when it was."""
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
            return True
        return False

    def get(self, node_id: str) -> WorkerSession | None:
        session = self._sessions.get(node_id)
        return session if session is not None and not session.closed else None

    def connected_node_ids(self) -> Sequence[str]:
        return [node_id for node_id, s in self._sessions.items() if not s.closed]

    async def invoke_embed(
        self,
        *,
        node_id: str,
        request_id: str,
        deployment_id: str,
        inputs: Sequence[str],
        timeout: float,
        trace_context: Mapping[str, str],
        deadline: timestamp_pb2.Timestamp,
    ) -> wg.EmbedResult:
        session = self.get(node_id)
        if session is None:
            raise GantryError("WORKER_UNAVAILABLE", f"node {node_id} is not connected")
        future: asyncio.Future[wg.InvokeResult] = asyncio.get_running_loop().create_future()
        session.pending_invokes[request_id] = future
        try:
            session.send(
                wg.ControlMessage(
                    trace_context=trace_context,
                    invoke=wg.Invoke(
                        request_id=request_id,
                        deployment_id=deployment_id,
                        deadline=deadline,
                        embed=wg.EmbedPayload(inputs=inputs),
                    ),
                )
            )
            result = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise GantryError(
                "DEADLINE_EXCEEDED", f"no answer from node {node_id} within {timeout:.1f}s"
            ) from None
        finally:
            session.pending_invokes.pop(request_id, None)
        if result.WhichOneof("outcome") == "failure":
            raise GantryError.from_failure(result.failure)
        return result.embed
