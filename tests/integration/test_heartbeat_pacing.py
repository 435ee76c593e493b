"""Heartbeat pacing on real streams: the control plane tells each stream its interval (longer as
the fleet on the replica grows, told to the streams already open), a worker beats at the
interval it was told, and a silent worker is still found, after the grace its interval gives.

A pacing of one heartbeat per base interval in all (`max_per_s` = 1 / base) makes every stream
a step: the first is told one base interval, the second two, and the first is told two as well.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from gantry.common.clock import ManualClock
from gantry.common.grpc_server import Keepalive
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.nodes.heartbeat_pacing import HeartbeatPacing
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.heartbeat_file import HeartbeatRecord, read_heartbeat
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

REPO_ROOT = Path(__file__).resolve().parents[2]


def one_beat_per_interval(harness: Harness, base_interval_s: float) -> None:
    harness.control_plane.gateway.pacing = HeartbeatPacing(
        base_interval_s=base_interval_s, max_per_s=1 / base_interval_s
    )


class PacedWorker(ScriptedWorker):
    """A scripted worker that keeps every HeartbeatInterval it is told (and never beats)."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[float] = []

    def _handle(self, message: wg.ControlMessage) -> None:
        if message.WhichOneof("kind") == "heartbeat_interval":
            self.told.append(message.heartbeat_interval.heartbeat_interval.ToNanoseconds() / 1e9)
        super()._handle(message)


async def state_of(harness: Harness, name: str) -> int:
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return {node.name: node.state for node in listed.nodes}[name]


async def test_a_silent_stream_told_a_longer_interval_is_found_after_the_longer_grace(
    database_url: str, tmp_path: Path
):
    settings = ReconcilerSettings(heartbeat_interval_s=5.0, stale_after_heartbeats=3.0)
    clock = ManualClock()
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url, root, clock=clock, reconciler=settings, run_reconciler=False
    ) as harness:
        one_beat_per_interval(harness, settings.heartbeat_interval_s)
        first, second = PacedWorker(), PacedWorker()
        try:
            await first.start(harness.channel, await harness.register_node("first"))
            assert first.welcome is not None
            assert first.welcome.heartbeat_interval.ToNanoseconds() == 5 * 10**9
            await second.start(harness.channel, await harness.register_node("second"))
            assert second.welcome is not None
            # Two streams at one heartbeat per 5 s in all: each beats every 10 s, and the stream
            # already open is told so.
            assert second.welcome.heartbeat_interval.ToNanoseconds() == 10 * 10**9
            await wait_for(lambda: first.told == [10.0], what="the first stream told 10 s")
            reconciler = harness.control_plane.reconciler

            clock.advance(settings.stale_after_s + 0.001)  # past the base grace: 3 beats of 5 s
            await reconciler.reconcile_once()
            for name in ("first", "second"):
                assert await state_of(harness, name) == common_pb2.NODE_STATE_CONNECTED, name

            # Past 10 s and the base grace's 10 s of slack (not 3 beats of 10 s) since either
            # was heard.
            clock.advance(settings.grace.seconds(2) - settings.stale_after_s)
            await reconciler.reconcile_once()
            for name in ("first", "second"):
                assert await state_of(harness, name) == common_pb2.NODE_STATE_DISCONNECTED, name
            await asyncio.wait_for(first.ended.wait(), 5)  # its stream was closed
        finally:
            await first.stop()
            await second.stop()


async def test_an_interval_as_long_as_the_job_lease_is_warned_of_once_it_is_told(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Only a heartbeat renews a job's lease: a fleet told to beat no sooner than the lease
    would let leases lapse between beats, and the operator is told when the interval gets there."""
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url, root, lease_seconds=8.0, run_reconciler=False
    ) as harness:
        one_beat_per_interval(harness, 5.0)
        first, second = PacedWorker(), PacedWorker()
        try:
            with caplog.at_level(logging.WARNING, logger="gantry.controlplane.nodes.gateway"):
                await first.start(harness.channel, await harness.register_node("first"))
                assert not [r for r in caplog.records if "job lease" in r.getMessage()]  # 5 s
                await second.start(harness.channel, await harness.register_node("second"))
                assert second.welcome is not None
                assert second.welcome.heartbeat_interval.ToNanoseconds() == 10 * 10**9
            [warned] = [r for r in caplog.records if "job lease" in r.getMessage()]
            assert "every 10 s, no sooner than the 8 s job lease" in warned.getMessage()
        finally:
            await first.stop()
            await second.stop()


async def test_a_worker_beats_at_the_interval_it_was_told(database_url: str, tmp_path: Path):
    base_s = 0.5
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url,
        root,
        reconciler=ReconcilerSettings(interval_s=0.2, heartbeat_interval_s=base_s),
    ) as harness:
        one_beat_per_interval(harness, base_s)
        liveness = harness.control_plane.liveness
        heard_at: dict[str, list[float]] = {}
        heard = liveness.heard

        def recording(node_id: str, generation: int, now: dt.datetime) -> bool:
            heard_at.setdefault(node_id, []).append(asyncio.get_running_loop().time())
            return heard(node_id, generation, now)

        liveness.heard = recording  # type: ignore[method-assign]
        beat_file = tmp_path / "heartbeat"
        agent = await harness.start_worker(
            await harness.register_node("real"), heartbeat_file=beat_file
        )
        silent = PacedWorker()
        try:
            await silent.start(harness.channel, await harness.register_node("silent"))
            told_at = asyncio.get_running_loop().time()

            def file_interval() -> float:
                contents = read_heartbeat(beat_file)
                return HeartbeatRecord.from_json(contents).interval_s if contents else 0.0

            await wait_for(lambda: file_interval() == 2 * base_s, what="the worker told 1 s")
            # Beats after the one that was already waiting out the old 0.5 s: 1 s apart or more.
            await wait_for(
                lambda: sum(t > told_at for t in heard_at.get(agent.node_id, [])) >= 4,
                what="four heartbeats after the longer interval was told",
            )
            after = [t for t in heard_at[agent.node_id] if t > told_at]
            gaps = [later - earlier for earlier, later in itertools.pairwise(after[1:])]
            assert gaps and min(gaps) >= 2 * base_s * 0.9, gaps
            assert await state_of(harness, "real") == common_pb2.NODE_STATE_CONNECTED
            # The silent one (told 1 s: grace 3 s) is still found.
            await wait_for(
                lambda: silent.ended.is_set(), what="the silent worker's stream closed as stale"
            )
            assert await state_of(harness, "silent") == common_pb2.NODE_STATE_DISCONNECTED
            assert await state_of(harness, "real") == common_pb2.NODE_STATE_CONNECTED
        finally:
            await silent.stop()


# A worker stream held by a process of its own, which the test freezes: it says nothing after
# its Hello, as a PacedWorker.
FROZEN_PEER = """
import asyncio, sys
from gantry.common.grpc_server import insecure_channel
from tests.integration.test_heartbeat_pacing import PacedWorker

async def main():
    worker = PacedWorker()
    async with insecure_channel(sys.argv[1]) as channel:
        await worker.start(channel, sys.argv[2])
        print("welcomed", flush=True)
        await worker.ended.wait()

asyncio.run(main())
"""


async def test_a_frozen_worker_is_found_by_the_transport_before_its_long_interval_ends(
    database_url: str, tmp_path: Path
):
    """A fleet large enough to give each worker a long interval does not leave a frozen one
    (SIGSTOP: its socket open, its process answering nothing) connected for three of them: the
    control plane's keepalive ping goes unanswered and the transport ends its stream. A quiet
    worker whose process runs answers the same pings and stays connected."""
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url,
        root,
        reconciler=ReconcilerSettings(interval_s=0.2, heartbeat_interval_s=600.0),
        keepalive=Keepalive(idle_s=0.5, timeout_s=0.5),
    ) as harness:
        quiet = PacedWorker()
        frozen = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            FROZEN_PEER,
            f"127.0.0.1:{harness.control_plane.port}",
            await harness.register_node("frozen"),
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        try:
            await quiet.start(harness.channel, await harness.register_node("quiet"))
            assert frozen.stdout is not None
            assert await asyncio.wait_for(frozen.stdout.readline(), 30) == b"welcomed\n"
            assert await state_of(harness, "frozen") == common_pb2.NODE_STATE_CONNECTED
            frozen.send_signal(signal.SIGSTOP)

            async def frozen_disconnected() -> bool:
                return await state_of(harness, "frozen") == common_pb2.NODE_STATE_DISCONNECTED

            # Its grace, 3 intervals of 600 s, is far off: only the transport can find it.
            await wait_for(frozen_disconnected, what="the frozen worker DISCONNECTED")
            assert await state_of(harness, "quiet") == common_pb2.NODE_STATE_CONNECTED
            assert not quiet.ended.is_set()
        finally:
            frozen.kill()  # a stopped process takes SIGKILL
            await frozen.wait()
            await quiet.stop()
