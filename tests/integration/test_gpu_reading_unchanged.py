"""Issue 29, item 3: a heartbeat may say its GPU reading is the one last sent on its stream
(`Heartbeat.gpus_unchanged`) instead of carrying it, where the stream's Welcome said the control
plane understands that (`Welcome.gpu_reading_unchanged_understood`).

The worker's side runs a real `gantry worker` process (NVML its one fake,
tests/integration/fake_nvml_worker.py) against a control plane of this test's own (a bare
`grpc.aio` server on port 0 recording every heartbeat): behind one that does not set the flag
(an older control plane) every heartbeat carries the whole reading; behind one that does, a
stream's first heartbeat carries it, the next ones say unchanged until the GPUs change, and a
new stream starts again with the whole reading. The control plane's side runs the real control
plane with a scripted worker: the reading it keeps stays right across unchanged heartbeats and
changed ones, and a heartbeat saying unchanged before any reading on its stream, or beside a
reading, is refused as a message past the protocol's bounds is (a Reject naming the field, then
the stream ends INVALID_ARGUMENT), logged as one line without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from gantry.common import tokens
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2, worker_gateway_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
UNCHANGED_FIELD = "Heartbeat.gpus_unchanged"


# ---- the worker, behind a control plane of this test's own -----------------------------------


def gpu_table(path: Path, *processes: tuple[int, int]) -> None:
    """One 24 GiB GPU holding `processes` (pid, bytes), as the fake NVML reads it."""
    used = sum(size for _, size in processes) + GIB // 2
    device = {"uuid": "GPU-0", "total": 24 * GIB, "used": used, "processes": list(processes)}
    path.write_text(json.dumps([device]))


@dataclass
class RecordingGateway(worker_gateway_pb2_grpc.WorkerGatewayServicer):
    """WorkerGateway.Connect answering each Hello with a Welcome (0.1 s heartbeats; the flag as
    `understood` says) and recording every heartbeat, per stream. The first stream is ended after
    `end_first_after` heartbeats (0: never): the worker dials again."""

    understood: bool
    end_first_after: int = 0
    streams: list[list[wg.Heartbeat]] = field(default_factory=list)

    async def Connect(
        self,
        request_iterator: AsyncIterator[wg.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[wg.ControlMessage]:
        hello = await anext(aiter(request_iterator), None)
        if hello is None or hello.WhichOneof("kind") != "hello":
            return
        beats: list[wg.Heartbeat] = []
        self.streams.append(beats)
        first = len(self.streams) == 1
        interval = duration_pb2.Duration()
        interval.FromMilliseconds(100)
        yield wg.ControlMessage(
            welcome=wg.Welcome(
                node_id="gpu",
                accepted_generation=7,
                heartbeat_interval=interval,
                gpu_reading_unchanged_understood=self.understood,
            )
        )
        async for message in request_iterator:
            if message.WhichOneof("kind") == "heartbeat":
                beats.append(message.heartbeat)
                if first and self.end_first_after and len(beats) >= self.end_first_after:
                    return  # the stream ends (status OK): the worker dials again

    def heartbeats(self) -> list[wg.Heartbeat]:
        return [beat for beats in self.streams for beat in beats]


@contextlib.asynccontextmanager
async def gpu_worker_behind(gateway: RecordingGateway, tmp_path: Path) -> AsyncIterator[Path]:
    """A real `gantry worker` process (fake NVML) streaming to `gateway`; yields its GPU table."""
    server = grpc.aio.server()
    worker_gateway_pb2_grpc.add_WorkerGatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    table = tmp_path / "gpus.json"
    gpu_table(table, (4242, 2 * GIB))
    credential = tmp_path / "gpu.credential"
    credential.write_text(tokens.mint_token(tokens.NODE_CREDENTIAL, "gpu") + "\n")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.integration.fake_nvml_worker", str(table)),
        *("--control-plane", f"127.0.0.1:{port}", "--credential-file", str(credential)),
        *("--artifact-root", str(artifacts), "--no-warm-pool"),
        *("--heartbeat-file", str(tmp_path / "gpu.heartbeat")),
        cwd=REPO,
    )
    try:
        yield table
    finally:
        worker.terminate()
        await worker.wait()
        await server.stop(grace=None)


# The GPUs once the test added an external process (the worker lists the largest first).
CHANGED = [(5151, 3 * GIB), (4242, 2 * GIB)]


def says_unchanged(beat: wg.Heartbeat) -> bool:
    return beat.gpus_unchanged and not beat.gpus and not beat.gpus_unavailable


def external_of(beat: wg.Heartbeat) -> list[tuple[int, int]]:
    return [(p.pid, p.used.bytes) for gpu in beat.gpus for p in gpu.processes if not p.managed]


async def test_behind_a_control_plane_without_the_flag_every_heartbeat_carries_the_reading(
    tmp_path: Path,
):
    gateway = RecordingGateway(understood=False)
    async with gpu_worker_behind(gateway, tmp_path):
        await wait_for(lambda: len(gateway.heartbeats()) >= 6, timeout=60, what="six heartbeats")
    beats = gateway.heartbeats()
    assert all(not beat.gpus_unchanged for beat in beats)
    assert all(external_of(beat) == [(4242, 2 * GIB)] for beat in beats)


async def test_behind_a_control_plane_with_the_flag_only_a_new_reading_is_sent(tmp_path: Path):
    gateway = RecordingGateway(understood=True, end_first_after=30)
    async with gpu_worker_behind(gateway, tmp_path) as table:
        # The first stream: its first heartbeat (sent before or right after the Welcome) carries
        # the reading, the rest say it is unchanged, until it changes.
        await wait_for(lambda: len(gateway.heartbeats()) >= 4, timeout=60, what="4 heartbeats")
        gpu_table(table, (4242, 2 * GIB), (5151, 3 * GIB))

        def changed_sent() -> bool:
            return any(external_of(beat) == CHANGED for beat in gateway.heartbeats())

        await wait_for(changed_sent, timeout=30, what="the changed reading sent")
        # The first stream ends after 30 heartbeats: the worker dials again, and that stream's
        # first heartbeat carries the reading again, whole.
        await wait_for(
            lambda: len(gateway.streams) >= 2 and len(gateway.streams[1]) >= 3,
            timeout=30,
            what="3 heartbeats on a second stream",
        )
    first, second = gateway.streams[0], gateway.streams[1]
    assert len(first) == 30
    assert external_of(first[0]) == [(4242, 2 * GIB)] and not first[0].gpus_unchanged
    changed = next(i for i, beat in enumerate(first) if not says_unchanged(beat) and i > 0)
    assert changed >= 4
    assert all(says_unchanged(beat) for beat in first[1:changed])
    assert external_of(first[changed]) == CHANGED
    assert all(says_unchanged(beat) for beat in first[changed + 1 :])
    assert external_of(second[0]) == CHANGED
    assert not second[0].gpus_unchanged
    assert all(says_unchanged(beat) for beat in second[1:])


# ---- the control plane, with a scripted worker ---------------------------------------------------


_STARTED: list[ScriptedWorker] = []


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(sqlite_url, tmp_path / "artifacts") as harness:
        try:
            yield harness
        finally:
            while _STARTED:
                await _STARTED.pop().stop()


async def connected(harness: Harness, name: str, *, generation: int = 1) -> ScriptedWorker:
    credential = harness.credentials.get(name) or await harness.register_node(name)
    worker = ScriptedWorker(generation=generation)
    _STARTED.append(worker)
    await worker.start(harness.channel, credential)
    return worker


def usage(external_bytes: int) -> list[wg.GpuUsage]:
    """One 24 GiB GPU: a managed process of 4 GiB, an external one of `external_bytes`."""
    processes = [
        wg.GpuProcess(pid=100, managed=True, used=common_pb2.Measurement(bytes=4 * GIB)),
        wg.GpuProcess(pid=200, used=common_pb2.Measurement(bytes=external_bytes)),
    ]
    return [
        wg.GpuUsage(
            device=0,
            total=common_pb2.Measurement(bytes=24 * GIB),
            used=common_pb2.Measurement(bytes=4 * GIB + external_bytes),
            processes=processes,
        )
    ]


def beat(worker: ScriptedWorker, **fields: object) -> None:
    heartbeat = wg.Heartbeat(resident_count=1, **fields)  # type: ignore[arg-type]
    heartbeat.sent_at.GetCurrentTime()
    worker.send(wg.WorkerMessage(heartbeat=heartbeat))


async def handled(worker: ScriptedWorker) -> None:
    """Every message sent before now was handled: a result for no job is refused (a Reject
    naming it) by the stream's writer, in the order sent, after each heartbeat before it."""
    job_id = str(uuid.uuid4())
    result = wg.JobResult(job_id=job_id, lease_token="none", failure=common_pb2.Failure())
    worker.send(wg.WorkerMessage(job_result=result))
    await wait_for(
        lambda: any(reject.job_id == job_id for reject in worker.rejects),
        timeout=20,
        what="the result for no job refused",
    )


async def stored(harness: Harness, name: str) -> cp.NodeGpus:
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    node_id = {node.name: node.node_id for node in listed.nodes}[name]
    inventory = await harness.operator.GetInventory(
        cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
    )
    return inventory.gpus


def external(reading: cp.NodeGpus) -> list[tuple[int, int]]:
    return [(claim.device, claim.bytes) for claim in reading.external_usage]


async def test_the_stored_reading_follows_unchanged_and_changed_heartbeats(gantry: Harness):
    worker = await connected(gantry, "steady")
    assert worker.welcome is not None and worker.welcome.gpu_reading_unchanged_understood

    beat(worker, gpus=usage(2 * GIB))
    await handled(worker)
    first = await stored(gantry, "steady")
    assert external(first) == [(0, 2 * GIB)]

    for _ in range(3):
        beat(worker, gpus_unchanged=True)
    # Unchanged with leases to renew: judged on the stream's writer, not inline.
    beat(worker, gpus_unchanged=True, active_job_ids=[str(uuid.uuid4())])
    await handled(worker)
    kept = await stored(gantry, "steady")
    assert kept == first  # not written again: the same reading, the same time

    beat(worker, gpus=usage(6 * GIB))  # moved by 4 GiB: written
    await handled(worker)
    assert external(await stored(gantry, "steady")) == [(0, 6 * GIB)]

    # Unchanged now means the 6 GiB reading: taken as the first one, it would be written back.
    for _ in range(3):
        beat(worker, gpus_unchanged=True)
    await handled(worker)
    assert external(await stored(gantry, "steady")) == [(0, 6 * GIB)]

    beat(worker, gpus=usage(6 * GIB + (16 << 20)))  # a wobble under the write step: not written
    beat(worker, gpus_unchanged=True)
    beat(worker, gpus=usage(2 * GIB))
    beat(worker, gpus_unchanged=True)
    await handled(worker)
    assert external(await stored(gantry, "steady")) == [(0, 2 * GIB)]
    assert worker.end_error is None and not worker.ended.is_set()

    # A heartbeat without the flag and without a reading is still an older worker's: no reading.
    beat(worker)
    await handled(worker)
    assert "older worker" in (await stored(gantry, "steady")).unavailable


@pytest.mark.parametrize(
    "before, broken",
    [
        pytest.param({}, {"gpus_unchanged": True}, id="unchanged-first"),
        pytest.param(
            {"gpus": usage(GIB)},
            {"gpus_unchanged": True, "gpus": usage(GIB)},
            id="unchanged-beside-gpus",
        ),
        pytest.param(
            {"gpus": usage(GIB)},
            {"gpus_unchanged": True, "gpus_unavailable": "NVML is not installed"},
            id="unchanged-beside-why-none",
        ),
    ],
)
async def test_a_heartbeat_misusing_unchanged_is_refused_and_the_stream_closed(
    gantry: Harness,
    caplog: pytest.LogCaptureFixture,
    before: dict[str, object],
    broken: dict[str, object],
):
    worker = await connected(gantry, "misused")
    if before:
        beat(worker, **before)
        await handled(worker)
    with caplog.at_level(logging.INFO):
        beat(worker, **broken)
        await asyncio.wait_for(worker.ended.wait(), 20)
    assert worker.rejects, "the worker is told why before its stream closes"
    failure = worker.rejects[-1].failure
    assert failure.reason == "INVALID_ARGUMENT"
    assert failure.metadata["field"] == UNCHANGED_FIELD
    assert worker.end_error is not None
    assert worker.end_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(worker.end_error)
    assert info is not None and info.metadata["field"] == UNCHANGED_FIELD
    # One bounded line, no traceback.
    refused = [r for r in caplog.records if "refused, stream closed" in r.getMessage()]
    assert len(refused) == 1 and not refused[0].exc_info
    # The node dials again and is served as before.
    again = await connected(gantry, "misused", generation=worker.generation)
    assert again.welcome is not None


async def test_a_reading_heard_on_another_stream_is_not_one_on_this_stream(gantry: Harness):
    worker = await connected(gantry, "redialled")
    beat(worker, gpus=usage(GIB))
    await handled(worker)
    await worker.stop()
    again = await connected(gantry, "redialled", generation=worker.generation)
    beat(again, gpus_unchanged=True)
    await asyncio.wait_for(again.ended.wait(), 20)
    assert again.end_error is not None
    assert again.end_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert again.rejects[-1].failure.metadata["field"] == UNCHANGED_FIELD
