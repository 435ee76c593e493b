"""Worker streams that end together are written together (nodes/goodbyes.py, issue 29): a fleet
that drops at once is marked DISCONNECTED in a few shared transactions, not one each queued for
the database's write turn (where, 1,000 at once on SQLite, half gave up and waited for the
reconciler's staleness instead)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from gantry.controlplane.nodes.goodbyes import MAX_PER_TRANSACTION, Goodbyes
from gantry.controlplane.platform.database import Database
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

WORKERS = 24


async def test_streams_that_end_together_share_their_goodbye_transactions(
    database_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as gantry:
        workers: list[tuple[ScriptedWorker, grpc.aio.Channel]] = []
        for index in range(WORKERS):
            credential = await gantry.register_node(f"drop-{index:02d}")
            # A connection of its own, as each worker has: they all drop at once below.
            channel = grpc.aio.insecure_channel(
                gantry.address, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            worker = ScriptedWorker()
            await worker.start(channel, credential)
            workers.append((worker, channel))
        goodbyes = gantry.control_plane.gateway.goodbyes
        before = goodbyes.transactions

        await asyncio.gather(*(channel.close() for _, channel in workers))
        states: list[tuple[str, int]] = []

        async def all_disconnected() -> bool:
            listed = await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
            states[:] = [(n.name, n.state) for n in listed.nodes if n.name.startswith("drop-")]
            return len(states) == WORKERS and all(
                state == common_pb2.NODE_STATE_DISCONNECTED for _, state in states
            )

        await wait_for(all_disconnected, what="every dropped worker DISCONNECTED", last=states)
        written = goodbyes.transactions - before
        # One each before; shared now (how many depends on when each end arrives).
        assert 1 <= written < WORKERS // 2, written
        for worker, _ in workers:
            await worker.stop()


class _GoodbyesHeldBack:
    """The gateway's Goodbyes, each end held before its write until `release` is set."""

    def __init__(self, goodbyes: Goodbyes) -> None:
        self._goodbyes = goodbyes
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.written = asyncio.Event()

    async def settle(self, stream: object) -> bool:
        self.entered.set()
        await self.release.wait()
        try:
            return await self._goodbyes.settle(stream)  # type: ignore[arg-type]
        finally:
            self.written.set()


async def test_a_worker_redialling_while_its_goodbye_is_written_stays_connected(
    database_url: str, tmp_path: Path
) -> None:
    """The same worker process (the same generation) redials while its old stream's goodbye is
    still to be written: its Hello waits for that write (the hub's turn per node), so the node
    ends CONNECTED under the new stream, not DISCONNECTED by the old one's goodbye."""
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as gantry:
        credential = await gantry.register_node("redial")
        channel = grpc.aio.insecure_channel(
            gantry.address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        worker = ScriptedWorker()
        await worker.start(channel, credential)
        (node,) = (
            await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
        ).nodes
        gateway = gantry.control_plane.gateway
        held = _GoodbyesHeldBack(gateway.goodbyes)
        gateway.goodbyes = held  # type: ignore[assignment]
        await channel.close()  # the old stream ends; its goodbye waits before its write
        await asyncio.wait_for(held.entered.wait(), 30)

        again = ScriptedWorker(generation=worker.generation)
        hello = asyncio.ensure_future(again.start(gantry.channel, credential))
        hub = gantry.control_plane.hub
        await wait_for(
            lambda: again.welcome is not None or hub.turns_wanted(node.node_id) == 2,
            what="the redial's Hello welcomed or waiting for the goodbye",
        )
        held.release.set()
        await hello
        await asyncio.wait_for(held.written.wait(), 30)
        (after,) = (
            await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
        ).nodes
        assert after.state == common_pb2.NODE_STATE_CONNECTED
        assert hub.get(node.node_id) is not None
        await again.stop()


class _Stream:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id


async def test_a_batch_that_fails_is_written_one_end_at_a_time() -> None:
    """One end whose write fails costs only that end its write: the batch is written again one
    stream per transaction, the others' answers come back, and the failing one hears its error."""
    database = Database.connect("sqlite+aiosqlite://")
    settled: list[str] = []

    async def settle(db: object, streams: list[_Stream], now: object) -> list[bool]:
        if any(stream.node_id == "node-b" for stream in streams):
            raise RuntimeError("node-b's row is broken")
        settled.extend(stream.node_id for stream in streams)
        return [stream.node_id == "node-c" for stream in streams]

    goodbyes = Goodbyes(database, _Clock(), settle)  # type: ignore[arg-type]
    ends = [goodbyes.settle(_Stream(node)) for node in ("node-c", "node-b", "node-a")]  # type: ignore[arg-type]
    results = await asyncio.gather(*ends, return_exceptions=True)
    assert results[0] is True and results[2] is False
    assert isinstance(results[1], RuntimeError)
    # The batch (in node order) failed for node-b; then each alone, in node order.
    assert settled == ["node-a", "node-c"]
    assert goodbyes.transactions == 1 + 3
    await database.engine.dispose()


async def test_ends_past_a_transactions_share_go_in_the_next() -> None:
    database = Database.connect("sqlite+aiosqlite://")
    sessions: list[object] = []  # the session each end was written in, in order

    async def settle(db: object, streams: list[_Stream], now: object) -> list[bool]:
        sessions.extend(db for _ in streams)
        return [False] * len(streams)

    goodbyes = Goodbyes(database, _Clock(), settle)  # type: ignore[arg-type]
    count = MAX_PER_TRANSACTION + 5
    ends = [goodbyes.settle(_Stream(f"node-{i:03d}")) for i in range(count)]  # type: ignore[arg-type]
    assert await asyncio.gather(*ends) == [False] * count
    first, second = sessions[0], sessions[-1]
    assert first is not second
    assert [db is first for db in sessions] == [True] * MAX_PER_TRANSACTION + [False] * 5
    assert goodbyes.transactions == 2
    await database.engine.dispose()


class _Clock:
    def now(self) -> object:
        return None


async def test_a_writer_cancelled_mid_batch_fails_every_end_it_held() -> None:
    """A writer cancelled while it writes (the loop ending) answers every end it took or had
    waiting, none left to wait for ever."""
    database = Database.connect("sqlite+aiosqlite://")
    started = asyncio.Event()

    async def settle(db: object, streams: list[_Stream], now: object) -> list[bool]:
        started.set()
        await asyncio.Event().wait()  # a write that never ends
        return [False] * len(streams)

    goodbyes = Goodbyes(database, _Clock(), settle)  # type: ignore[arg-type]
    ends = [asyncio.ensure_future(goodbyes.settle(_Stream(f"node-{i}"))) for i in range(3)]  # type: ignore[arg-type]
    await started.wait()
    later = asyncio.ensure_future(goodbyes.settle(_Stream("node-late")))  # type: ignore[arg-type]
    await wait_for(lambda: len(goodbyes._waiting) == 1, what="the late end waiting")
    assert goodbyes._writer is not None
    goodbyes._writer.cancel()
    results = await asyncio.gather(*ends, later, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results), results
    await database.engine.dispose()
