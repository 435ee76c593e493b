"""Worker streams that end together are written together: their goodbyes share transactions.

Why (issue 29, `make bench`'s fleet bench, 1,000 simulated workers on SQLite): when the simulator
stopped, its 1,000 streams ended within a second, and each goodbye opened a write transaction of
its own. They queued for the database's one write turn; past its 5 s wait in that queue a goodbye
gave up ("could not mark node ... disconnected": 510 of the 1,000 in one run), and its node stayed
CONNECTED until the reconciler found the row stale, 28 s later at that fleet size, where a stream
that ends is meant to be seen at once (docs/limits.md).

So a goodbye joins the batch being gathered: the ends that arrive in the same turn of the event
loop, and every end that arrives while a batch is being written, go in the next transaction, at
most MAX_PER_TRANSACTION of them, in node order (two replicas' batches then lock the nodes' rows
in one order). Each stream's end is still its own decision (`settle_ends`: the rules the
gateway applied to one before), made for the whole batch in a fixed number of statements, not a
number per end: with ~7 statements an end, 1,000 ends were 7,000 round trips to SQLite's one
connection thread, which the fleet bench's drop waited on (13-22 s until every node read
DISCONNECTED). A batch whose transaction fails is written again one stream per transaction, so
one node's failed write costs that node alone, as it did before.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.clock import Clock
from gantry.controlplane.deployments.settle import settle_nodes_deployments
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.sessions import WorkerHub, WorkerStream
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import NodeChanged, record
from gantry.controlplane.platform.models import Node

log = logging.getLogger(__name__)

# Ends per transaction at most: enough that 1,000 streams ending at once take 16 transactions,
# few enough that one never holds the write turn for long (and its statements' bound
# parameters stay far below SQLite's limit).
MAX_PER_TRANSACTION = 64

# Streams' ends, in the caller's transaction: for each, whether another replica still holds
# its node.
Settle = Callable[[AsyncSession, Sequence[WorkerStream], dt.datetime], Awaitable[list[bool]]]
_Waiting = tuple[WorkerStream, "asyncio.Future[bool]"]


class Goodbyes:
    def __init__(self, database: Database, clock: Clock, settle: Settle) -> None:
        self._database = database
        self._clock = clock
        self._settle = settle
        self._waiting: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None
        self.transactions = 0  # opened so far, batches and their one-by-one retries alike

    async def settle(self, stream: WorkerStream) -> bool:
        """Whether another replica still holds the stream's node, once its end is written (with
        the others that ended meanwhile); raises what the write raised."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self._waiting.append((stream, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all(), name="worker-goodbyes")
        # A caller cancelled while it waits leaves the others' write alone.
        return await asyncio.shield(future)

    async def _write_all(self) -> None:
        batch: list[_Waiting] = []
        try:
            await asyncio.sleep(0)  # the ends of this turn join the first batch
            while self._waiting:
                batch = sorted(self._waiting[:MAX_PER_TRANSACTION], key=_node_of)
                del self._waiting[:MAX_PER_TRANSACTION]
                await self._write(batch)
        except BaseException as error:  # cancelled: no caller may wait on a write never made
            _fail([*batch, *self._waiting], error)
            self._waiting.clear()
            raise
        finally:
            self._writer = None

    async def _write(self, batch: list[_Waiting]) -> None:
        try:
            held = await self._transaction(batch)
        except Exception as error:
            if len(batch) == 1:
                _fail(batch, error)
                return
            log.warning(
                "writing %d worker streams' ends together failed (%s); writing each alone",
                len(batch),
                error,
            )
            for each in batch:
                await self._write([each])
            return
        for (_, future), holds in zip(batch, held, strict=True):
            if not future.done():
                future.set_result(holds)

    async def _transaction(self, batch: list[_Waiting]) -> list[bool]:
        self.transactions += 1
        now = self._clock.now()
        async with self._database.transaction() as db:
            return await self._settle(db, [stream for stream, _ in batch], now)


async def settle_ends(
    hub: WorkerHub, db: AsyncSession, streams: Sequence[WorkerStream], now: dt.datetime
) -> list[bool]:
    """Streams' ends (the `Settle` the gateway gives its Goodbyes), in a transaction they share:
    this replica's rows of the streams deleted; for each, whether another replica still holds
    a fresh stream of its generation (then its node stays CONNECTED), else its node
    DISCONNECTED. Six statements however many streams, and one a deployment to settle."""
    ends = [(stream.node_id, stream.generation) for stream in streams]
    # Two replicas' goodbyes of one node take turns on its row: each must see the other's row
    # gone, or both would find the other's still there and neither disconnect the node.
    locked = await nodes.lock_nodes(db, [node_id for node_id, _ in ends])
    await nodes.forget_streams(db, replica_id=hub.replica_id, ends=ends)
    held = await nodes.held_elsewhere_among(
        db, ends=ends, replica_id=hub.replica_id, heard_since=hub.held_since(now)
    )
    gone = [end for end in ends if end not in held]
    if gone:
        await _disconnect(db, locked, gone, now)
    return [end in held for end in ends]


async def _disconnect(
    db: AsyncSession, locked: Sequence[Node], ends: Sequence[tuple[str, int]], now: dt.datetime
) -> None:
    """The nodes DISCONNECTED whose `ends` (node id, generation) still hold them. A node a newer
    generation took (on another replica's stream) is neither settled nor announced here: that
    generation's Hello did both."""
    await nodes.mark_disconnected(db, locked, ends, now=now)
    ended = set(ends)
    # Marked now, or DISCONNECTED already by this generation (the reconciler found it silent).
    settled = [node for node in locked if (node.node_id, node.generation) in ended]
    await settle_nodes_deployments(db, [node.node_id for node in settled], now=now)
    record(db, *(NodeChanged(node) for node in settled))


def _retrieved(future: asyncio.Future[bool]) -> None:
    # A caller cancelled while it waited never reads its write's failure: read here, so that
    # asyncio does not log it as an exception nobody retrieved (the gateway logs it once).
    if not future.cancelled():
        future.exception()


def _node_of(waiting: _Waiting) -> str:
    return waiting[0].node_id


def _fail(batch: list[_Waiting], error: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(error)
