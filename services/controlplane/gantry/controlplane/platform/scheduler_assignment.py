"""One active scheduler among several: the leader names it in the `scheduler_assignment` row,
every control-plane replica follows the row (its scheduler link connects to the named address).

A control plane given several scheduler addresses (`--scheduler a,b`) runs a `SchedulerAssignment`
loop. Each pass reads the row; on the leader it then decides (scheduler_assignment_rules.py)
whether to name another scheduler: none is named yet, the named one is not in the list, or its
link has heard nothing from it for the silence timeout while taking no request (killed: the
stream is down and reconnects are refused; stopped: its pings go unanswered). The leader then
health-checks the candidates (the addresses after the named one, wrapping round) and writes the
first that answers with the next epoch, a compare-and-set on the epoch in a fenced transaction
(platform/leadership.py): a replica that lost the lead, or read a row already moved, writes
nothing. Every replica, the leader included, then has its link follow the row's address.

Passes come every leader lease/3 while the link takes requests, and every `TROUBLE_INTERVAL_S`
while it does not, so a follower moves within that of the leader's write. All replicas use one
scheduler at a time, and one scheduler core decides every replica's work: a tenant cannot double
its share by spreading calls over replicas. An old scheduler that comes back is named by no row
and gets no stream (the links cut theirs to it when they moved).

Until a scheduler is named (before the leader's first pass, or while none answers) a replica's
link talks to the first address. A control plane given one address runs no loop and never reads
the row: its link talks to that address, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.grpc_server import channel
from gantry.common.tasks import stop_task
from gantry.common.tls import ClientTls
from gantry.controlplane.platform import scheduler_assignment_rules as rules
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.leadership import Leadership
from gantry.controlplane.platform.models import SchedulerAssignmentRow
from gantry.controlplane.platform.scheduler_link import SchedulerLink

log = logging.getLogger(__name__)

ROW_ID = 1  # the one row of scheduler_assignment (made by migration 0013)
# How often the row is read while this replica's link takes no request: a follower moves this
# soon after the leader has written (one small read; only while the link is down or silent).
TROUBLE_INTERVAL_S = 0.25


# ---- the row ----------------------------------------------------------------------------------


async def read_assignment(session: AsyncSession) -> rules.Assignment:
    row = await session.get(SchedulerAssignmentRow, ROW_ID)
    if row is None:  # the migration makes it; a missing one names nothing
        return rules.Assignment()
    return rules.Assignment(address=row.address, epoch=row.epoch)


async def write_assignment(
    session: AsyncSession, seen: rules.Assignment, wanted: rules.Assignment, clock: Clock
) -> bool:
    """Name `wanted` if the row still holds the epoch `seen` was read at (compare-and-set):
    False when another move landed first."""
    result = await session.execute(
        update(SchedulerAssignmentRow)
        .where(SchedulerAssignmentRow.id == ROW_ID, SchedulerAssignmentRow.epoch == seen.epoch)
        .values(address=wanted.address, epoch=wanted.epoch, assigned_at=clock.now())
        .returning(SchedulerAssignmentRow.id)
    )
    return result.first() is not None


async def stored_assignment(database: Database) -> rules.Assignment:
    """The row as it is now (operators and tests)."""
    async with database.transaction() as session:
        return await read_assignment(session)


# ---- health checks ----------------------------------------------------------------------------


async def answers(address: str, tls: ClientTls | None, timeout: float) -> bool:
    """Whether a scheduler at `address` says SERVING within `timeout`."""
    try:
        async with channel(address, tls) as probe:
            reply = await health_pb2_grpc.HealthStub(probe).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def answering(
    addresses: Sequence[str], tls: ClientTls | None, timeout: float
) -> dict[str, bool]:
    """Every candidate checked at once: a stopped one costs its timeout, not one per address."""
    replies = await asyncio.gather(*(answers(a, tls, timeout) for a in addresses))
    return dict(zip(addresses, replies, strict=True))


# ---- the loop ---------------------------------------------------------------------------------


class SchedulerAssignment:
    """Reads the row, moves it when leading and the active scheduler failed, has the link
    follow it (see the module's docstring)."""

    def __init__(
        self,
        *,
        addresses: Sequence[str],
        database: Database,
        leadership: Leadership,
        link: SchedulerLink,
        clock: Clock,
        silence_timeout_s: float,
        tls: ClientTls | None = None,
    ) -> None:
        self._addresses = tuple(addresses)
        self._database = database
        self._leadership = leadership
        self._link = link
        self._clock = clock
        self._silence_timeout_s = silence_timeout_s
        self._tls = tls
        self._interval_s = leadership.lease_s / 3
        self._task: asyncio.Task[None] | None = None
        self._unanswered = False  # a move was due and no candidate answered (logged once)
        self.passes = 0  # passes so far (tests wait on it)

    async def start(self) -> None:
        """One pass now (a lone leader names a scheduler before it serves), then the loop."""
        await self._pass()
        self._task = asyncio.create_task(self._run(), name="scheduler-assignment")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            trouble = not self._link.connected
            await asyncio.sleep(
                min(self._interval_s, TROUBLE_INTERVAL_S) if trouble else self._interval_s
            )
            await self._pass()

    async def _pass(self) -> None:
        """`step`, its failure logged: the next pass starts afresh."""
        try:
            await self.step()
        except GantryError as error:  # the store is out, or the lead was lost (NOT_LEADER)
            log.warning("scheduler assignment pass failed: %s: %s", error.reason, error.message)
        except Exception:
            log.exception("scheduler assignment pass failed")

    async def step(self) -> None:
        """One pass: read the row; on the leader, move it if due; follow it. Until a scheduler
        is named (the leader's first pass, or a leader that runs no assignment, mid-upgrade),
        the link talks to the first address, as with one."""
        assigned = await stored_assignment(self._database)
        if self._leadership.is_leader:
            assigned = await self._decide(assigned)
        self._link.follow(assigned.address or self._addresses[0])
        self.passes += 1

    async def _decide(self, assigned: rules.Assignment) -> rules.Assignment:
        link = self._link
        silent_for = link.silent_for()
        # Only the link's view of the named scheduler says whether it failed.
        failed = assigned.address == link.address and rules.active_failed(
            connected=link.connected,
            silent_for_s=silent_for,
            silence_timeout_s=self._silence_timeout_s,
        )
        why = rules.reassign_reason(
            self._addresses, assigned, failed=failed, silent_for_s=silent_for
        )
        if why is None:
            self._unanswered = False
            return assigned
        order = rules.probe_order(self._addresses, assigned.address)
        # A candidate stopped mid-check costs this much, once (they are checked together).
        heard = await answering(order, self._tls, self._silence_timeout_s / 3)
        chosen = rules.choose(order, heard)
        if chosen is None:
            if not self._unanswered:
                log.warning("%s, and no other scheduler answers (%s)", why, ", ".join(order))
            self._unanswered = True
            return assigned
        self._unanswered = False
        return await self._move(assigned, rules.moved(assigned, chosen), why=why)

    async def _move(
        self, seen: rules.Assignment, wanted: rules.Assignment, *, why: str
    ) -> rules.Assignment:
        """Write the move (fenced: only the leader's epoch lands); the row as it then is."""
        with self._leadership.fenced():
            async with self._database.transaction() as session:
                written = await write_assignment(session, seen, wanted, self._clock)
        if not written:
            return await stored_assignment(self._database)  # another move landed first
        # The first naming is routine; a move away from a named scheduler is a failover.
        (log.warning if seen.address else log.info)(
            "%s: every replica now uses the scheduler at %s (assignment epoch %d)",
            why,
            wanted.address,
            wanted.epoch,
        )
        return wanted
