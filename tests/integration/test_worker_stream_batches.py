"""Issue 29: a worker stream carries what waits in either end's outbox as one message
(ControlMessage.batch, WorkerMessage.batch), each end only once the other said it reads them
(Hello.control_batches_understood, Welcome.worker_batches_understood).

The real control plane with scripted workers: what its outbox holds at once goes as one batch to
a worker that reads batches and one by one to one that does not; the results a worker sends in
one batch answer their calls; a batch is held to the protocol's bounds as each of its messages
would be alone (a Reject naming the field, the stream ended INVALID_ARGUMENT). And a real worker
agent reads a batch's messages in order.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from gantry.common.status import error_info_of
from gantry.common.stream_batches import MAX_BATCH_MESSAGES
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker, serving_tiny


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def scripted(harness: Harness, name: str, *, reads_batches: bool) -> ScriptedWorker:
    worker = ScriptedWorker()
    worker.reads_batches = reads_batches
    await worker.start(harness.channel, await harness.register_node(name))
    return worker


def acks_sent_at_once(harness: Harness, worker_node: str, job_ids: list[str]) -> None:
    """Put `job_ids`' acks in the node's stream outbox in one turn of the loop: its writer wakes
    to find them all waiting."""
    stream = next(s for s in harness.control_plane.hub.streams() if s.node_id == worker_node)
    for job_id in job_ids:
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id=job_id)))


async def node_id_of(harness: Harness, name: str) -> str:
    from gantry.v1 import control_plane_pb2 as cp

    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return {node.name: node.node_id for node in listed.nodes}[name]


@pytest.mark.parametrize("reads_batches", [True, False], ids=["reads-batches", "older-worker"])
async def test_what_waits_in_the_outbox_goes_as_one_batch_only_to_a_worker_that_reads_it(
    gantry: Harness, reads_batches: bool
):
    worker = await scripted(gantry, "outbox", reads_batches=reads_batches)
    try:
        assert worker.welcome is not None and worker.welcome.worker_batches_understood
        job_ids = [str(uuid.uuid4()) for _ in range(3)]
        acks_sent_at_once(gantry, await node_id_of(gantry, "outbox"), job_ids)
        await wait_for(lambda: len(worker.acks) == 3, timeout=10, what="the three acks")
        assert worker.acks == job_ids  # in order either way
        assert worker.batches == ([3] if reads_batches else [])
    finally:
        await worker.stop()


async def test_results_in_one_batch_answer_their_calls(gantry: Harness, tiny_model_dir: Path):
    async with serving_tiny(gantry, tiny_model_dir, max_concurrency=8) as worker:
        calls = [
            asyncio.ensure_future(
                gantry.inference.Embed(
                    inf.EmbedRequest(capability="tiny", inputs=[f"call {i}"] * (1 + i // 2)),
                    metadata=gantry.client_md,
                    timeout=20,
                )
            )
            for i in range(4)
        ]
        invokes = [await asyncio.wait_for(worker.invokes.get(), timeout=10) for _ in calls]
        results = [
            wg.WorkerMessage(
                generation=worker.generation,
                invoke_result=wg.InvokeResult(
                    request_id=invoke.request_id,
                    embed=wg.EmbedResult(
                        count=len(invoke.embed.inputs),
                        dim=1,
                        float32_le=b"\x00\x00\x80\x3f" * len(invoke.embed.inputs),
                    ),
                ),
            )
            for invoke in invokes
        ]
        worker.send(wg.WorkerMessage(batch=wg.WorkerBatch(messages=results)))
        answers = await asyncio.gather(*calls)
        assert [len(answer.vectors) for answer in answers] == [1, 1, 2, 2]


def no_job_result() -> wg.WorkerMessage:
    result = wg.JobResult(
        job_id=str(uuid.uuid4()), lease_token="none", failure=common_pb2.Failure()
    )
    return wg.WorkerMessage(job_result=result)


async def test_a_batchs_messages_are_taken_in_order_each_as_if_alone(gantry: Harness):
    worker = await scripted(gantry, "ordered", reads_batches=False)
    try:
        messages = [no_job_result() for _ in range(3)]
        for message in messages:
            message.generation = worker.generation
        worker.send(wg.WorkerMessage(batch=wg.WorkerBatch(messages=messages)))
        # Each result for no job is refused on its own, in the order of the batch.
        await wait_for(lambda: len(worker.rejects) == 3, timeout=10, what="three rejects")
        assert [r.job_id for r in worker.rejects] == [m.job_result.job_id for m in messages]
        assert not worker.ended.is_set()
    finally:
        await worker.stop()


def nested() -> wg.WorkerMessage:
    return wg.WorkerMessage(
        batch=wg.WorkerBatch(messages=[wg.WorkerMessage(batch=wg.WorkerBatch())])
    )


def too_many() -> wg.WorkerMessage:
    beats = [wg.WorkerMessage(heartbeat=wg.Heartbeat()) for _ in range(MAX_BATCH_MESSAGES + 1)]
    return wg.WorkerMessage(batch=wg.WorkerBatch(messages=beats))


def inner_past_its_bound() -> wg.WorkerMessage:
    result = wg.InvokeResult(request_id="r" * 1000)
    return wg.WorkerMessage(batch=wg.WorkerBatch(messages=[wg.WorkerMessage(invoke_result=result)]))


def hello_inside() -> wg.WorkerMessage:
    return wg.WorkerMessage(batch=wg.WorkerBatch(messages=[wg.WorkerMessage(hello=wg.Hello())]))


@pytest.mark.parametrize(
    "broken, field",
    [
        pytest.param(nested, "WorkerMessage.kind", id="nested"),
        pytest.param(hello_inside, "WorkerMessage.kind", id="hello-inside"),
        pytest.param(too_many, "WorkerMessage.batch.messages", id="too-many"),
        pytest.param(inner_past_its_bound, "invoke_result.request_id", id="inner-past-bound"),
    ],
)
async def test_a_batch_breaking_the_protocol_is_refused_and_the_stream_closed(
    gantry: Harness,
    broken,
    field: str,  # type: ignore[no-untyped-def]
):
    worker = await scripted(gantry, "broken", reads_batches=True)
    try:
        message = broken()
        for inner in message.batch.messages:
            inner.generation = worker.generation
        worker.send(message)
        await asyncio.wait_for(worker.ended.wait(), 20)
        assert worker.end_error is not None
        assert worker.end_error.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info_of(worker.end_error)
        assert info is not None and info.metadata["field"].endswith(field)
    finally:
        await worker.stop()


async def test_a_real_worker_reads_a_batchs_messages_in_order(gantry: Harness):
    agent = await gantry.start_worker(await gantry.register_node("real"))
    stream = gantry.control_plane.hub.get(agent.node_id)
    assert stream is not None and stream.batches_understood  # its Hello said so
    told = []
    for seconds in (40, 50):
        interval = duration_pb2.Duration(seconds=seconds)
        told.append(
            wg.ControlMessage(heartbeat_interval=wg.HeartbeatInterval(heartbeat_interval=interval))
        )
    for message in told:
        stream.send(message)  # both waiting when the writer wakes: one batch
    # Both applied in order: the last interval told is the one it beats at.
    await wait_for(lambda: agent._heartbeat_seconds == 50, timeout=10, what="paced at 50 s")
    assert gantry.control_plane.hub.get(agent.node_id) is stream  # the stream held
