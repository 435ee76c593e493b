"""The control plane's end of the Scheduler.Connect stream: one open stream, replayed on reconnect.

Requests to the scheduler (dispatch this work, place this deployment) wait on a future keyed by
their id; the stream's reader resolves them. When the stream drops, every waiter fails with
SCHEDULER_UNAVAILABLE at once, and the link reconnects with backoff and replays the cluster state.

No state update is lost across a reconnect. Updates are announced after they are committed, so
while the link is REPLAYING it buffers them before it reads the snapshot: an update committed
before the read is in the snapshot, one committed after it is in the buffer, and the buffer goes
out right after the snapshot (the scheduler applies updates as idempotent upserts). Updates
announced while DISCONNECTED are dropped on purpose: they were committed before the next
snapshot's read starts.

Everything is bounded and nothing blocks: a request past `waiters_limit` or a full outbox is
answered QUEUE_FULL; an update that finds the outbox (or the replay buffer) full cannot be dropped
silently, so the link resynchronises: it ends the stream after what is queued, and the reconnect
sends a fresh snapshot that holds the update.

A scheduler that is alive but silent (stopped, or its event loop stuck) keeps the stream open:
nothing ends it until gRPC keepalive (CHANNEL_OPTIONS: a ping every 20 s, 10 s to answer) gives
up on the transport, and a reconnect to a stopped process still connects (the kernel accepts into
its backlog). So the link asks on the stream's own channel: a health check every third of
`silence_timeout_seconds`, each with that deadline. One that goes unanswered makes the scheduler
SILENT: every waiting request fails SCHEDULER_UNAVAILABLE at once and new ones are refused so
until a ping, or any output on the stream, is answered again; the stream stays as it is, so
nothing queued on it is lost. A request's own wait can be long (queued for capacity), so it is
never what decides silence. The pings and what counts as an answer are scheduler_silence.py's.

Outputs nobody waits for (a breaker that moved, scale advice) go to optional callbacks, called on
the stream's reader: each must only schedule work (record it, wake a loop), never block.

Credits (CreditGranted, CreditsRevoked: the scheduler's policy/credits.py) go to the one credit
listener (serving/credits.py), with the stream's epoch: a credit is valid only on the stream that
granted it, so every stream the link opens has a new epoch, and the listener hears `lost` when one
ends (the scheduler takes that stream's credits back itself).

The address can change while the link runs (`follow`: the scheduler assignment moved, see
platform/scheduler_assignment.py): the stream to the old scheduler is cut at once (its waiters
fail SCHEDULER_UNAVAILABLE: their work was queued there) and the link connects to the new one
without backoff, replaying the snapshot as on any reconnect. With a failover hold
(`failover_hold_s`, used when several schedulers are configured) a request that finds the link
between schedulers waits for it, at most the hold and its own deadline, instead of being refused
at once: a failover then costs callers a wait, not a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from gantry.common.auth import auth_metadata
from gantry.common.errors import GantryError
from gantry.common.grpc_server import channel
from gantry.common.ids import new_id
from gantry.common.telemetry import inject_context
from gantry.common.tls import ClientTls
from gantry.controlplane.platform.scheduler_silence import (
    DEFAULT_SILENCE_TIMEOUT_SECONDS,
    Liveness,
    watch_silence,
)
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

ClusterStateSource = Callable[[], Awaitable[scheduler_pb2.ClusterState]]
BreakerListener = Callable[[scheduler_pb2.BreakerChanged], None]
ScaleAdviceListener = Callable[[scheduler_pb2.ScaleAdvice], None]
_CLOSE = object()


class CreditListener(Protocol):
    """Who keeps the credits the scheduler grants this link (serving/credits.py)."""

    def granted(self, grant: scheduler_pb2.CreditGranted, epoch: int) -> None: ...

    def revoked(self, credit_ids: Sequence[str]) -> None: ...

    def lost(self) -> None: ...


_Output = TypeVar("_Output", scheduler_pb2.BreakerChanged, scheduler_pb2.ScaleAdvice)

DEFAULT_OUTBOX_LIMIT = 4096
MAX_BATCH = 256  # inputs coalesced into one stream message at most
DEFAULT_WAITERS_LIMIT = 4096
DEFAULT_REPLAY_BUFFER_LIMIT = 4096
# Snapshot reads retried when updates overflow the replay buffer while one is being read.
_MAX_SNAPSHOT_READS = 3
# With several schedulers, how long a request waits for the link to come back (failing over to
# another) before it is refused (docs/limits.md): the silence timeout plus the leader's and the
# followers' passes that move every replica, with room to spare.
DEFAULT_FAILOVER_HOLD_SECONDS = 5.0


class PlacementRefused(GantryError):
    """A refused PlaceDeployment: the scheduler's reason, and why each node said no."""

    def __init__(self, rejected: scheduler_pb2.Rejected) -> None:
        refused = GantryError.from_failure(rejected.failure)
        super().__init__(refused.reason, refused.message, **refused.metadata)
        self.node_refusals = list(rejected.node_refusals)


class LinkPhase(enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    REPLAYING = "REPLAYING"  # reading the snapshot; updates go to the replay buffer
    CONNECTED = "CONNECTED"
    RESYNCING = "RESYNCING"  # an update overflowed: the stream ends after what is queued


class SchedulerLink:
    def __init__(
        self,
        *,
        address: str,
        service_token: str,
        cluster_state: ClusterStateSource,
        reconnect_max_seconds: float = 5.0,
        outbox_limit: int = DEFAULT_OUTBOX_LIMIT,
        waiters_limit: int = DEFAULT_WAITERS_LIMIT,
        replay_buffer_limit: int = DEFAULT_REPLAY_BUFFER_LIMIT,
        tls: ClientTls | None = None,
        on_breaker_changed: BreakerListener | None = None,
        on_scale_advice: ScaleAdviceListener | None = None,
        silence_timeout_seconds: float = DEFAULT_SILENCE_TIMEOUT_SECONDS,
        failover_hold_s: float = 0.0,
    ) -> None:
        self._address = address
        self._hold_s = failover_hold_s
        self._on_breaker_changed = on_breaker_changed
        self._on_scale_advice = on_scale_advice
        # Breaker moves heard, by the state entered (BREAKER_STATE_* name): for operators/tests.
        self.breaker_changes: Counter[str] = Counter()
        self._tls = tls
        self._token = service_token
        self._cluster_state = cluster_state
        self._reconnect_max = reconnect_max_seconds
        self._outbox_limit = outbox_limit
        self._waiters_limit = waiters_limit
        self._replay_limit = replay_buffer_limit
        self._outbox = self._new_outbox()
        self._waiters: dict[str, asyncio.Future[scheduler_pb2.SchedulerOutput]] = {}
        self._phase = LinkPhase.DISCONNECTED
        self._liveness = Liveness.ANSWERING
        self._silence_timeout = silence_timeout_seconds
        self._replay_buffer: list[scheduler_pb2.SchedulerInput] = []
        self._replay_overflowed = False
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attempt: asyncio.Task[None] | None = None  # the current stream's task
        self._moved = asyncio.Event()  # `follow` named another address: reconnect at once
        # When the current address last answered (a ping or an output), time.monotonic(); a
        # move starts the count afresh.
        self._last_heard = time.monotonic()
        self._epoch = 0  # streams opened: a credit is valid on its own stream's epoch only
        self._credit_listener: CreditListener | None = None

    @property
    def epoch(self) -> int:
        """The current stream's number: credits granted on another one are not valid."""
        return self._epoch

    def listen_credits(self, listener: CreditListener) -> None:
        """The one listener for credits (a second replaces the first)."""
        self._credit_listener = listener

    @property
    def connected(self) -> bool:
        """The stream is up and the scheduler answers: requests are taken."""
        return self._phase is LinkPhase.CONNECTED and self._liveness is Liveness.ANSWERING

    @property
    def phase(self) -> LinkPhase:
        return self._phase

    @property
    def liveness(self) -> Liveness:
        return self._liveness

    @property
    def address(self) -> str:
        """The scheduler this link talks to (or reconnects to)."""
        return self._address

    @property
    def waiting(self) -> int:
        """Requests sent that wait for the scheduler's answer (bounded: QUEUE_FULL beyond)."""
        return len(self._waiters)

    def silent_for(self) -> float:
        """Seconds since the current address last answered (since the move to it, if never)."""
        return time.monotonic() - self._last_heard

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="scheduler-link")

    def follow(self, address: str) -> None:
        """Talk to the scheduler at `address` from now on: starts the link if it is not running;
        a stream to another address is cut at once and the link connects to this one."""
        if address != self._address:
            log.warning("moving to the scheduler at %s (from %s)", address, self._address)
            self._address = address
            # Silence belonged to the old process; the new one has a full timeout to answer.
            self._liveness = Liveness.ANSWERING
            self._last_heard = time.monotonic()
            self._moved.set()
            if self._attempt is not None:
                # No request may enter the old stream while its task winds down.
                self._set_phase(LinkPhase.DISCONNECTED)
                self._attempt.cancel()
        self.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._set_phase(LinkPhase.DISCONNECTED)
        self._fail_waiters("the control plane is stopping")
        self._credits_lost()

    async def wait_connected(self, timeout: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    # ---- requests -----------------------------------------------------------------------------

    async def dispatch(
        self, work: scheduler_pb2.WorkSubmitted, *, timeout: float
    ) -> scheduler_pb2.Dispatch:
        message = scheduler_pb2.SchedulerInput(work_submitted=work)
        output = await self._request(work.work_id, message, timeout=timeout)
        return output.dispatch

    def work_finished(
        self,
        work_id: str,
        outcome: scheduler_pb2.WorkOutcome,
        *,
        reason: str = "",
        credit_id: str = "",
        cost: int = 0,
    ) -> None:
        """`credit_id`, `cost`: the call went on that credit, never submitted (its cost is charged
        now)."""
        self._send(
            scheduler_pb2.SchedulerInput(
                work_finished=scheduler_pb2.WorkFinished(
                    work_id=work_id, outcome=outcome, reason=reason, credit_id=credit_id, cost=cost
                )
            )
        )

    def credits_returned(self, credit_ids: Sequence[str]) -> None:
        """Credits this link will not use again: the scheduler frees their slots."""
        self._send(
            scheduler_pb2.SchedulerInput(
                credits_returned=scheduler_pb2.CreditsReturned(credit_ids=credit_ids)
            )
        )

    async def place(
        self,
        *,
        deployment_id: str,
        replicas: int,
        required_adapter: str,
        claims: Sequence[common_pb2.ResourceClaim] = (),
        required_labels: Sequence[str] = (),
        policy: common_pb2.PlacementPolicy = common_pb2.PLACEMENT_POLICY_BIN_PACK,
        constraints: common_pb2.PlacementConstraints | None = None,
        timeout: float = 10.0,
    ) -> list[str]:
        """The nodes for up to `replicas` new replicas; a refusal raises `PlacementRefused`."""
        request_id = new_id()
        message = scheduler_pb2.SchedulerInput(
            place_deployment=scheduler_pb2.PlaceDeployment(
                request_id=request_id,
                deployment_id=deployment_id,
                replicas=replicas,
                required_adapter=required_adapter,
                claims=claims,
                required_labels=required_labels,
                policy=policy,
                constraints=constraints,
            )
        )
        output = await self._request(request_id, message, timeout=timeout)
        return list(output.placement.node_ids)

    def placement_released(self, deployment_id: str, node_ids: Sequence[str]) -> None:
        """Placed nodes that got no residency: the scheduler drops their holds now."""
        self._send(
            scheduler_pb2.SchedulerInput(
                placement_released=scheduler_pb2.PlacementReleased(
                    deployment_id=deployment_id, node_ids=node_ids
                )
            )
        )

    def node_changed(self, node: scheduler_pb2.SchedulerNode) -> None:
        self._send(scheduler_pb2.SchedulerInput(node_update=scheduler_pb2.NodeUpdate(node=node)))

    def node_removed(self, node_id: str) -> None:
        """Deleted: the scheduler forgets it (the next snapshot leaves it out as well)."""
        self._send(
            scheduler_pb2.SchedulerInput(
                node_update=scheduler_pb2.NodeUpdate(
                    node=scheduler_pb2.SchedulerNode(node_id=node_id), removed=True
                )
            )
        )

    def residency_changed(self, residency: scheduler_pb2.SchedulerResidency) -> None:
        self._send(
            scheduler_pb2.SchedulerInput(
                residency_update=scheduler_pb2.ResidencyUpdate(residency=residency)
            )
        )

    def deployment_changed(
        self, deployment: scheduler_pb2.SchedulerDeployment, *, removed: bool = False
    ) -> None:
        self._send(
            scheduler_pb2.SchedulerInput(
                deployment_update=scheduler_pb2.DeploymentUpdate(
                    deployment=deployment, removed=removed
                )
            )
        )

    def tenant_policies_changed(self, policies: Sequence[common_pb2.TenantPolicy]) -> None:
        """Stored policies, announced after their commit; the scheduler applies them as upserts."""
        self._send(
            scheduler_pb2.SchedulerInput(
                tenant_policies=scheduler_pb2.TenantPolicies(policies=policies)
            )
        )

    async def queue_snapshot(self, *, timeout: float) -> scheduler_pb2.QueueSnapshot:
        """The scheduler's live queue for operators: a unary call on a channel of its own, so it
        neither waits behind the stream's outbox nor needs the stream to be up."""
        if self._liveness is Liveness.SILENT:
            raise self._silent_error()
        try:
            async with channel(self._address, self._tls) as snapshot_channel:
                stub = scheduler_pb2_grpc.SchedulerStub(snapshot_channel)
                return await stub.GetQueueSnapshot(
                    scheduler_pb2.GetQueueSnapshotRequest(),
                    metadata=auth_metadata(self._token),
                    timeout=timeout,
                )
        except grpc.aio.AioRpcError as error:
            raise GantryError(
                "SCHEDULER_UNAVAILABLE",
                f"the scheduler at {self._address} did not give its queue snapshot:"
                f" {error.code().name} {error.details()}",
                code=error.code().name,
            ) from None

    def _send(self, message: scheduler_pb2.SchedulerInput) -> None:
        """Queue a one-way message (a state update, a finished work). Never blocks or raises."""
        if self._phase is LinkPhase.REPLAYING:
            if len(self._replay_buffer) >= self._replay_limit:
                # Committed before this announcement, so a snapshot read from now on holds it.
                self._replay_overflowed = True
            else:
                self._replay_buffer.append(message)
        elif self._phase is LinkPhase.CONNECTED:
            if self._outbox_full():
                self._resync("the outbox to the scheduler is full")
            else:
                self._outbox.put_nowait(message)
        # DISCONNECTED / RESYNCING: the next snapshot (read after this commit) covers it.

    async def _await_link(self, timeout: float) -> None:
        """Refuse SCHEDULER_UNAVAILABLE unless the link takes requests; with a failover hold,
        first wait for it, at most the hold and `timeout`."""
        hold = min(self._hold_s, timeout)
        if not self.connected and hold > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), hold)
        if not self.connected:
            raise self._unavailable()

    async def _request(
        self, key: str, message: scheduler_pb2.SchedulerInput, *, timeout: float
    ) -> scheduler_pb2.SchedulerOutput:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self._await_link(timeout)
        timeout = max(0.0, deadline - loop.time())  # what the hold left of it
        if len(self._waiters) >= self._waiters_limit:
            raise GantryError(
                "QUEUE_FULL", f"{self._waiters_limit} requests already wait on the scheduler"
            )
        if self._outbox_full():
            raise GantryError("QUEUE_FULL", "the outbox to the scheduler is full")
        if key in self._waiters:
            raise GantryError("ALREADY_EXISTS", f"a request {key} already waits on the scheduler")
        inject_context(message.trace_context)
        future: asyncio.Future[scheduler_pb2.SchedulerOutput] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters[key] = future
        self._outbox.put_nowait(message)
        try:
            output = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise GantryError(
                "SCHEDULER_UNAVAILABLE", f"the scheduler did not answer within {timeout:.1f}s"
            ) from None
        finally:
            self._waiters.pop(key, None)
        if output.WhichOneof("kind") == "rejected":
            if output.rejected.node_refusals:
                raise PlacementRefused(output.rejected)
            raise GantryError.from_failure(output.rejected.failure)
        return output

    # ---- the stream ---------------------------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.1
        while True:
            self._moved.clear()
            self._attempt = asyncio.create_task(self._connect_once(), name="scheduler-stream")
            why = "the scheduler stream was lost"
            try:
                await self._attempt
                delay = 0.1
            except asyncio.CancelledError:
                if self._stopping():
                    raise
                why = f"the control plane moved to the scheduler at {self._address}"
            except grpc.aio.AioRpcError as error:
                log.warning("scheduler stream ended: %s %s", error.code().name, error.details())
            except Exception:
                log.exception("scheduler stream failed")
            self._set_phase(LinkPhase.DISCONNECTED)
            self._fail_waiters(why)
            self._credits_lost()
            if self._moved.is_set():
                delay = 0.1  # a new address: connect at once
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), delay)
            delay = 0.1 if self._moved.is_set() else min(delay * 2, self._reconnect_max)

    def _stopping(self) -> bool:
        """Whether the link itself is being cancelled (`stop`), not only its current stream."""
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _connect_once(self) -> None:
        async with channel(self._address, self._tls) as scheduler_channel:
            stub = scheduler_pb2_grpc.SchedulerStub(scheduler_channel)
            self._epoch += 1  # before anything is sent: the last stream's credits are void now
            self._outbox = self._new_outbox()
            for message in await self._replay():
                self._outbox.put_nowait(message)
            # No await between the replay and CONNECTED: nothing can slip between them.
            self._set_phase(LinkPhase.CONNECTED)
            call = stub.Connect(self._outgoing(), metadata=auth_metadata(self._token))
            log.info("connected to the scheduler at %s", self._address)
            watch = asyncio.create_task(
                watch_silence(
                    scheduler_channel,
                    self._silence_timeout,
                    heard=self._heard,
                    fell_silent=self._fell_silent,
                ),
                name="scheduler-link-pings",
            )
            try:
                async for output in call:
                    self._heard()
                    self._resolve(output)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    def _heard(self) -> None:
        self._last_heard = time.monotonic()
        if self._liveness is Liveness.SILENT:
            log.info("the scheduler at %s answers again: taking requests", self._address)
            self._liveness = Liveness.ANSWERING
            self._refresh_connected()

    def _fell_silent(self, code: grpc.StatusCode) -> None:
        if self._liveness is Liveness.SILENT:
            return
        log.warning(
            "the scheduler at %s did not answer a ping within %.1fs (%s): refusing requests"
            " until it answers",
            self._address,
            self._silence_timeout,
            code.name,
        )
        self._liveness = Liveness.SILENT
        self._refresh_connected()
        self._fail_waiters(self._silent_error().message)

    def _unavailable(self) -> GantryError:
        """Why requests are refused now: no stream, or a stream to a scheduler that is silent."""
        if self._phase is LinkPhase.CONNECTED and self._liveness is Liveness.SILENT:
            return self._silent_error()
        return GantryError("SCHEDULER_UNAVAILABLE", "the scheduler is not connected")

    def _silent_error(self) -> GantryError:
        return GantryError(
            "SCHEDULER_UNAVAILABLE",
            f"the scheduler at {self._address} has not answered for {self._silence_timeout:.1f}s"
            " (stopped or stuck); retry once it answers again",
        )

    async def _replay(self) -> list[scheduler_pb2.SchedulerInput]:
        """The snapshot, then every update announced while it was read."""
        for _ in range(_MAX_SNAPSHOT_READS):
            self._replay_buffer = []
            self._replay_overflowed = False
            self._set_phase(LinkPhase.REPLAYING)
            snapshot = await self._cluster_state()
            if not self._replay_overflowed:
                break
            log.warning("updates overflowed the replay buffer; reading the snapshot again")
        else:
            raise GantryError("QUEUE_FULL", "updates kept overflowing the replay buffer")
        # Credits only to a link whose grants someone uses (serving/credits.py listens).
        snapshot.takes_credits = self._credit_listener is not None
        buffered, self._replay_buffer = self._replay_buffer, []
        if len(buffered) + 1 > self._outbox_limit:
            raise GantryError("QUEUE_FULL", "the replay does not fit the outbox to the scheduler")
        return [scheduler_pb2.SchedulerInput(cluster_state=snapshot), *buffered]

    def resynchronise(self, why: str) -> None:
        """Have the scheduler rebuild from a snapshot read after this call: for a committed
        change that cannot be announced as it is (the snapshot then carries it whole)."""
        if self._phase is LinkPhase.REPLAYING:
            self._replay_overflowed = True  # the snapshot being read may predate the change
        elif self._phase is LinkPhase.CONNECTED:
            self._resync(why)
        # DISCONNECTED / RESYNCING: the next snapshot is read after this call anyway.

    def _new_outbox(self) -> asyncio.Queue[scheduler_pb2.SchedulerInput | object]:
        # One slot past the limit stays free for the close marker of a resync.
        return asyncio.Queue(maxsize=self._outbox_limit + 1)

    def _outbox_full(self) -> bool:
        return self._outbox.qsize() >= self._outbox_limit

    def _resync(self, why: str) -> None:
        log.warning("resynchronising with the scheduler: %s", why)
        self._set_phase(LinkPhase.RESYNCING)
        self._outbox.put_nowait(_CLOSE)

    def _set_phase(self, phase: LinkPhase) -> None:
        self._phase = phase
        self._refresh_connected()

    def _refresh_connected(self) -> None:
        if self.connected:
            self._connected.set()
        else:
            self._connected.clear()

    async def _outgoing(self) -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        """The outbox, in order. What is already waiting goes as one InputBatch: under load a
        stream message then costs once for many calls, and an idle link still sends each at once."""
        outbox = self._outbox
        while True:
            message = await outbox.get()
            if message is _CLOSE:
                return
            assert isinstance(message, scheduler_pb2.SchedulerInput)
            batch = [message]
            closing = False
            while len(batch) < MAX_BATCH and not outbox.empty():
                more = outbox.get_nowait()
                if more is _CLOSE:
                    closing = True
                    break
                assert isinstance(more, scheduler_pb2.SchedulerInput)
                batch.append(more)
            if len(batch) == 1:
                yield message
            else:
                yield scheduler_pb2.SchedulerInput(batch=scheduler_pb2.InputBatch(inputs=batch))
            if closing:
                return

    def _resolve(self, output: scheduler_pb2.SchedulerOutput) -> None:
        kind = output.WhichOneof("kind")
        if kind == "batch":
            for inner in output.batch.outputs:
                if inner.WhichOneof("kind") == "batch":
                    log.error("a nested scheduler output batch was ignored")
                    continue
                self._resolve(inner)
            return
        if kind == "dispatch":
            key = output.dispatch.work_id
        elif kind == "rejected":
            key = output.rejected.work_id
        elif kind == "placement":
            key = output.placement.request_id
        elif kind == "breaker_changed":
            self._breaker_changed(output.breaker_changed)
            return
        elif kind == "scale_advice":
            self._notify(self._on_scale_advice, output.scale_advice, kind)
            return
        elif kind in ("credit_granted", "credits_revoked"):
            self._credits(output)
            return
        else:
            log.error("unknown scheduler output %r", kind)
            return
        future = self._waiters.get(key)
        if future is not None and not future.done():
            future.set_result(output)

    def _credits_lost(self) -> None:
        """The stream ended: the scheduler takes its credits back itself."""
        if self._credit_listener is not None:
            self._credit_listener.lost()

    def _credits(self, output: scheduler_pb2.SchedulerOutput) -> None:
        listener = self._credit_listener
        if listener is None:
            # Nobody dispatches on credits here: give a grant back at once, so its slots serve.
            if output.HasField("credit_granted"):
                self.credits_returned([output.credit_granted.credit_id])
            return
        if output.HasField("credit_granted"):
            listener.granted(output.credit_granted, self._epoch)
        else:
            listener.revoked(output.credits_revoked.credit_ids)

    def _breaker_changed(self, change: scheduler_pb2.BreakerChanged) -> None:
        state = scheduler_pb2.BreakerState.Name(change.state)
        self.breaker_changes[state] += 1
        # An opening breaker takes capacity away: worth an operator's attention.
        opening = change.state == scheduler_pb2.BREAKER_STATE_OPEN
        level = logging.WARNING if opening else logging.INFO
        log.log(
            level,
            "scheduler breaker %s on node %s%s after %d consecutive failure(s)",
            state.removeprefix("BREAKER_STATE_"),
            change.node_id,
            f" deployment {change.deployment_id}" if change.deployment_id else "",
            change.consecutive_failures,
        )
        self._notify(self._on_breaker_changed, change, "breaker_changed")

    @staticmethod
    def _notify(listener: Callable[[_Output], None] | None, message: _Output, kind: str) -> None:
        if listener is None:
            return
        try:
            listener(message)
        except Exception:
            # A listener's bug must not end the stream that every request depends on.
            log.exception("the %s listener failed", kind)

    def _fail_waiters(self, why: str) -> None:
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(GantryError("SCHEDULER_UNAVAILABLE", why))
