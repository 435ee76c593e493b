"""Issue 26 from an attacker's side, against real services (`gantry up`'s three processes): idle
and slow connections by the thousand, oversize and malformed input on every door and on the
worker stream, heavy calls abandoned, the scheduler stopped. After each, the other tenant is
served on both doors, the control plane's descriptors and memory return near their baseline,
and every refusal is typed (an ErrorInfo reason), nothing mislabelled.

The tests share one stack (tests/hostile/conftest.py); each leaves it serving, so their order
does not matter.
"""

from __future__ import annotations

import asyncio
import re
import resource
import signal
import time
from pathlib import Path

import grpc
import httpx2
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.inference_limits import MAX_INPUTS, MAX_REQUEST_TEXT_BYTES
from gantry.common.status import error_info_of
from gantry.controlplane.app import INFERENCE_PREFIX, front_door_limits, receive_limit_bytes
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.serving import TEST_HOOK_SLOW_INPUT
from tests.chaos.cluster import CallOutcome, wait_until
from tests.hostile.stack import (
    CAPABILITY,
    HANG_GUARD_S,
    HostileStack,
    close_all,
    http_head,
    open_descriptors,
    open_held,
    raw_http,
    refused,
    resident_bytes,
    settles_near,
)
from tests.integration.scripted_worker import ENVIRONMENT, ScriptedWorker

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

HELD_CONNECTIONS = 2_000
# Descriptors the control plane's count may drift by beside the held connections (a database
# connection or a gRPC channel opened or closed meanwhile), far below the 2,000 it holds.
DESCRIPTOR_MARGIN = 32
# Resident memory the control plane may keep above its baseline after the floods: allocator
# arenas, caches warmed by the first refusal. A flood kept whole would be 10 to 60 MiB per call.
RSS_MARGIN = 64 * 1024 * 1024
MIB = 1024 * 1024
# The stack's control plane runs with the default limits.
FRONT_DOOR_LIMITS = front_door_limits(InferenceSettings())
RECEIVE_LIMIT = receive_limit_bytes(InferenceSettings(), FRONT_DOOR_LIMITS)
# The largest request the gRPC Inference door takes, and the HTTP door's body bound
# (app.py, _start_http_api).
BODY_BOUND = FRONT_DOOR_LIMITS[INFERENCE_PREFIX].max_request_bytes or 0


def _descriptor_room(needed: int) -> int:
    """This process's open-descriptor limit, raised towards `needed` where the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed and (hard == resource.RLIM_INFINITY or hard > soft):
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def _descriptor_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return 1 << 30 if soft == "unlimited" else int(soft)
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


async def test_thousands_of_idle_and_slow_connections_leave_both_doors_serving(
    stack: HostileStack,
) -> None:
    needed = HELD_CONNECTIONS + 512  # this process's own, the gRPC channel, the log files
    if _descriptor_room(needed) < needed:
        pytest.skip(f"`ulimit -n` is below {needed}: cannot hold {HELD_CONNECTIONS} connections")
    pid = stack.control_plane_pid
    # The door holds at most half the control plane's descriptors (it raised its own limit).
    if _descriptor_limit_of(pid) < 2 * needed:
        pytest.skip(f"the control plane's open-descriptor limit is below {2 * needed}")
    await stack.both_doors_serve_the_victim()  # what opens lazily is in the baseline
    baseline = open_descriptors(pid)

    half = HELD_CONNECTIONS // 2
    slow_header = b"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\n"  # never finished
    held = await asyncio.to_thread(open_held, stack.http_port, half, b"")
    try:
        held += await asyncio.to_thread(open_held, stack.http_port, half, slow_header)
        await wait_until(
            lambda: open_descriptors(pid) >= baseline + HELD_CONNECTIONS - DESCRIPTOR_MARGIN,
            timeout_s=HANG_GUARD_S,
            what=f"the control plane holding {HELD_CONNECTIONS} connections",
            last=lambda: open_descriptors(pid) - baseline,
        )
        # A new client is answered on both doors while every held connection is still open.
        await stack.both_doors_serve_the_victim()
        assert open_descriptors(pid) >= baseline + HELD_CONNECTIONS - DESCRIPTOR_MARGIN
    finally:
        close_all(held)
    await settles_near(
        lambda: open_descriptors(pid),
        baseline,
        DESCRIPTOR_MARGIN,
        what="the control plane's open descriptors",
    )
    await stack.both_doors_serve_the_victim()


async def _after_the_flood(stack: HostileStack, rss_baseline: int) -> None:
    """The other tenant is served on both doors, the invariants hold, the memory came back."""
    await stack.both_doors_serve_the_victim()
    await stack.wait_invariants_hold()
    await settles_near(
        lambda: resident_bytes(stack.control_plane_pid),
        rss_baseline,
        RSS_MARGIN,
        what="the control plane's resident memory",
    )


async def test_oversize_embeds_on_the_grpc_door_are_refused(stack: HostileStack) -> None:
    await stack.both_doors_serve_the_victim()
    rss = resident_bytes(stack.control_plane_pid)
    metadata = auth_metadata(stack.api_key)

    def embed(inputs: list[str]) -> object:
        return stack.inference.Embed(
            inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=inputs),
            metadata=metadata,
            timeout=HANG_GUARD_S,
        )

    # Past the text a call may hold: parsed, then refused by the Inference checks.
    text = await refused(embed(["x" * MIB] * (MAX_REQUEST_TEXT_BYTES // MIB + 4)))
    assert (text.code, text.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD"), text
    assert text.metadata["setting"] == "max_request_bytes", text
    # Past the Inference service's bound (its largest legal call, media included), under the
    # transport's receive limit: refused typed before it is parsed.
    assert BODY_BOUND + 2 * MIB < RECEIVE_LIMIT
    unparsed = await refused(embed(["x" * MIB] * (BODY_BOUND // MIB + 1)))
    assert (unparsed.code, unparsed.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    ), unparsed
    assert unparsed.metadata["limit_bytes"] == str(BODY_BOUND), unparsed
    # Past the receive limit: gRPC refuses it from the length prefix, before it is read, so its
    # status carries no ErrorInfo by design (docs/errors.md, "the transport's refusal").
    past_the_limit = await refused(embed(["x" * MIB] * (RECEIVE_LIMIT // MIB + 4)))
    assert past_the_limit.code == grpc.StatusCode.RESOURCE_EXHAUSTED, past_the_limit
    assert "larger than max" in past_the_limit.details, past_the_limit
    # Many inputs, each small: over the call's input count.
    too_many = await refused(embed(["x"] * (MAX_INPUTS + 1)))
    assert (too_many.code, too_many.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAYLOAD",
    ), too_many
    await _after_the_flood(stack, rss)


@pytest.mark.parametrize(
    "method", ["/gantry.v1.Inference/Embed", "/inference.GRPCInferenceService/ModelInfer"]
)
async def test_raw_bytes_on_the_grpc_doors_are_refused_before_they_are_parsed(
    stack: HostileStack, method: str
) -> None:
    """Both gRPC doors (Gantry's and the Open Inference Protocol's): bytes past the bound are
    refused unread, bytes that are no message of the method are refused as such."""
    rss = resident_bytes(stack.control_plane_pid)
    assert stack.channel is not None
    call = stack.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    metadata = auth_metadata(stack.api_key)
    oversize = await refused(call(b"\x00" * (BODY_BOUND + 1), metadata=metadata, timeout=30))
    assert (oversize.code, oversize.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    ), oversize
    assert oversize.metadata["limit_bytes"] == str(BODY_BOUND), oversize
    garbage = await refused(call(b"\xff" * 64, metadata=metadata, timeout=30))
    assert (garbage.code, garbage.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    ), garbage
    assert "does not parse" in garbage.details, garbage
    await _after_the_flood(stack, rss)


async def test_oversize_and_malformed_bodies_on_the_http_door_are_refused(
    stack: HostileStack,
) -> None:
    await stack.both_doors_serve_the_victim()
    rss = resident_bytes(stack.control_plane_pid)
    key = stack.api_key

    declared = BODY_BOUND + 1  # declared, never sent: refused on the headers alone
    status, body = await raw_http(stack.http_port, [http_head(key, f"content-length: {declared}")])
    assert (status, body["error"]["code"]) == (413, "INVALID_ARGUMENT"), body

    chunk = b"x" * MIB
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # chunked: no length to refuse
    past_the_bound = BODY_BOUND // len(chunk) + 2
    status, body = await raw_http(
        stack.http_port, [http_head(key, "transfer-encoding: chunked"), *[framed] * past_the_bound]
    )
    assert (status, body["error"]["code"]) == (413, "INVALID_ARGUMENT"), body

    for malformed in (b'{"model": "shared", "input": [', b"\xff\xfe not json", b"[" * 100_000):
        head = http_head(key, f"content-length: {len(malformed)}")
        status, body = await raw_http(stack.http_port, [head + malformed])
        assert (status, body["error"]["code"]) == (400, "INVALID_ARGUMENT"), (malformed[:40], body)
    await _after_the_flood(stack, rss)


LONG_NAME = "m" * MIB


async def test_a_1_mib_model_name_is_refused_without_being_echoed(stack: HostileStack) -> None:
    rss = resident_bytes(stack.control_plane_pid)
    async with httpx2.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", timeout=HANG_GUARD_S
    ) as http:
        answer = await http.post(
            "/embeddings",
            json={"model": LONG_NAME, "input": ["hi"]},
            headers={"authorization": f"Bearer {stack.api_key}"},
        )
    assert answer.status_code == 404, answer.status_code
    # No deployment is bound to it; the refusal names an excerpt of it, not all of it.
    assert answer.json()["error"]["code"] == "NOT_FOUND", answer.text[:300]
    assert len(answer.content) < 16_384, f"the refusal is {len(answer.content)} bytes"

    grpc_refusal = await refused(
        stack.inference.Embed(
            inference_pb2.EmbedRequest(capability=LONG_NAME, inputs=["hi"]),
            metadata=auth_metadata(stack.api_key),
            timeout=HANG_GUARD_S,
        )
    )
    assert grpc_refusal.reason == "NOT_FOUND", grpc_refusal.details[:300]
    assert len(grpc_refusal.details) < 16_384, f"the message is {len(grpc_refusal.details)} chars"
    assert all(len(value) < 16_384 for value in grpc_refusal.metadata.values()), "in its metadata"
    await _after_the_flood(stack, rss)


# -- the worker stream ----------------------------------------------------------------------

JOB_ID = "0b7c2f4e-9f1a-4d55-8f0e-2d3c1b0a9e88"


async def _node_credential(stack: HostileStack, name: str) -> str:
    registered = await stack.operator.RegisterNode(
        cp.RegisterNodeRequest(name=name), metadata=stack.op_md, timeout=10
    )
    return registered.credential


async def _worker_refused(worker: ScriptedWorker, field: str) -> None:
    """The stream was closed after a Reject naming `field`."""
    await asyncio.wait_for(worker.ended.wait(), HANG_GUARD_S)
    assert worker.rejects, f"the stream ended without a Reject: {worker.end_error}"
    failure = worker.rejects[-1].failure
    assert (failure.reason, failure.metadata["field"]) == ("INVALID_ARGUMENT", field), failure


async def test_oversize_worker_fields_are_refused_and_the_node_may_dial_again(
    stack: HostileStack,
) -> None:
    rss = resident_bytes(stack.control_plane_pid)
    credential = await _node_credential(stack, "hostile-fields")
    channel = stack.channel
    assert channel is not None
    generation = 1
    floods = [
        (
            wg.WorkerMessage(job_update=wg.JobUpdate(job_id=JOB_ID, progress="x" * 8_000_000)),
            "WorkerMessage.job_update.progress",
        ),
        (
            wg.WorkerMessage(job_update=wg.JobUpdate(job_id="j" * 100_000)),
            "WorkerMessage.job_update.job_id",
        ),
        (
            wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=[JOB_ID] * 40_000)),
            "WorkerMessage.heartbeat.active_job_ids",
        ),
    ]
    for message, field in floods:
        worker = ScriptedWorker(generation=generation)
        await worker.start(channel, credential)
        generation = worker.generation
        worker.send(message)
        await _worker_refused(worker, field)
    again = ScriptedWorker(generation=generation)
    await again.start(channel, credential)
    assert again.welcome is not None
    await again.stop()
    await _after_the_flood(stack, rss)


GARBAGE = b"\xff\xff\xff\xff garbage, not a WorkerMessage"


@pytest.mark.parametrize("after_hello", [False, True], ids=["first", "after-hello"])
async def test_garbage_on_the_worker_stream_is_refused_typed(
    stack: HostileStack, after_hello: bool
) -> None:
    rss = resident_bytes(stack.control_plane_pid)
    credential = await _node_credential(stack, f"hostile-garbage-{after_hello}")
    assert stack.channel is not None
    connect = stack.channel.stream_stream(
        "/gantry.v1.WorkerGateway/Connect",
        request_serializer=None,  # bytes as they are: the test writes what it likes
        response_deserializer=wg.ControlMessage.FromString,
    )
    call = connect(metadata=auth_metadata(credential), timeout=HANG_GUARD_S)
    answers: list[wg.ControlMessage] = []
    if after_hello:
        hello = wg.Hello(hostname="raw", environments=[ENVIRONMENT], inventory=wg.Inventory())
        await call.write(wg.WorkerMessage(hello=hello, generation=1).SerializeToString())
        welcome = await call.read()
        assert isinstance(welcome, wg.ControlMessage) and welcome.WhichOneof("kind") == "welcome"
    await call.write(GARBAGE)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        while isinstance(answer := await call.read(), wg.ControlMessage):
            answers.append(answer)
        raise AssertionError(f"the stream ended OK after garbage: {answers}")
    info = error_info_of(ended.value)
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ended.value
    assert info is not None and info.reason == "INVALID_ARGUMENT", ended.value
    assert "does not parse" in (ended.value.details() or ""), ended.value
    await _after_the_flood(stack, rss)


# -- abandoned heavy calls ------------------------------------------------------------------

HEAVY_CHUNKS = 20
# Every chunk holds the slow input, so each of the HEAVY_CHUNKS takes TEST_HOOK_SLOW_S (1.5 s):
# run whole, one heavy call holds the model for 30 s.
HEAVY_EMBED = [TEST_HOOK_SLOW_INPUT, "heavy"] * HEAVY_CHUNKS
HEAVY_DEADLINE_S = 1.0
STOPPED = re.compile(r"stopped (cancelled|expired) request (\d+) after (\d+) of its (\d+) inputs")


async def test_abandoned_heavy_calls_stop_in_the_host_and_the_other_tenant_is_served(
    stack: HostileStack,
) -> None:
    await stack.both_doors_serve_the_victim()
    stopped_before = len(stack.worker_log_lines(STOPPED))
    heavy = [
        refused(
            stack.inference.Embed(
                inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=HEAVY_EMBED),
                metadata=auth_metadata(stack.api_key),
                timeout=HEAVY_DEADLINE_S,
            )
        )
        for _ in range(3)
    ]
    for abandoned in await asyncio.gather(*heavy):
        assert abandoned.code == grpc.StatusCode.DEADLINE_EXCEEDED, abandoned

    # Had the host run them whole, the victim would queue behind 30 s of chunks for each heavy
    # call that reached it.
    await stack.victim_embed(timeout_s=HANG_GUARD_S)
    # The host's stderr reaches the worker's log a moment after the host wrote it.
    await wait_until(
        lambda: len(stack.worker_log_lines(STOPPED)) > stopped_before,
        timeout_s=HANG_GUARD_S,
        what="the model host stopping an abandoned call between two chunks",
    )
    stopped = stack.worker_log_lines(STOPPED)[stopped_before:]
    for match in stopped:
        ran, asked = int(match.group(3)), int(match.group(4))
        assert asked == len(HEAVY_EMBED) and ran < asked, match.group(0)
    await stack.wait_invariants_hold()


# -- the scheduler stopped ------------------------------------------------------------------


async def _http_embed_refusal(stack: HostileStack) -> tuple[int, str]:
    """The status and error code of an embedding call on the HTTP door (which carries no
    deadline: the server's own cap binds)."""
    async with httpx2.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", timeout=STOPPED_CALL_TIMEOUT_S
    ) as http:
        answer = await http.post(
            "/embeddings",
            json={"model": CAPABILITY, "input": ["hi"]},
            headers={"authorization": f"Bearer {stack.api_key}"},
        )
    return answer.status_code, answer.json().get("error", {}).get("code", "")


# Far beyond the control plane's silence bound (docs/limits.md), so a typed answer cannot be the
# deadline's.
STOPPED_CALL_TIMEOUT_S = 60.0
# Calls served on a credit before the silence is found: far more than the silence bound holds
# (one takes a few ms); past it the test fails rather than loop.
CREDITED_CALLS_AT_MOST = 5_000


async def _stopped_call(stack: HostileStack) -> CallOutcome:
    return await stack.embed(
        CAPABILITY, phase="scheduler stopped", timeout_s=STOPPED_CALL_TIMEOUT_S
    )


async def test_a_stopped_scheduler_is_answered_typed_and_serving_resumes_on_sigcont(
    stack: HostileStack,
) -> None:
    assert stack.scheduler is not None
    assert (await stack.embed(CAPABILITY, phase="baseline")).ok

    stack.scheduler.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    stopped: list[CallOutcome] = []
    try:
        # Until the link finds the scheduler silent (docs/limits.md), a call may still go on a
        # credit this control plane holds (the baseline's success may have earned one:
        # serving/credits.py), served with no scheduler hop. From the first refusal on, every
        # call is refused, typed, until SIGCONT.
        while len(stopped) < CREDITED_CALLS_AT_MOST and (not stopped or stopped[-1].ok):
            stopped.append(await _stopped_call(stack))
        refused = [await _stopped_call(stack) for _ in range(3)]
        http_status, http_code = await _http_embed_refusal(stack)
    finally:
        stack.scheduler.send(signal.SIGCONT)
    for outcome in stopped[:-1]:
        assert outcome.ok, outcome  # served on a credit before the silence was found
    for outcome in [stopped[-1], *refused]:
        # Typed: a call held to its deadline would end DEADLINE_EXCEEDED with no reason.
        assert not outcome.ok and outcome.reason == "SCHEDULER_UNAVAILABLE", (outcome, stopped)
    assert (http_status, http_code) == (503, "SCHEDULER_UNAVAILABLE")

    await stack.wait_serving_again(
        CAPABILITY, phase="scheduler resumed", timeout_s=60, since=stopped_at
    )
    await stack.both_doors_serve_the_victim()
    await stack.wait_invariants_hold()
    stack.ledger.assert_truthful()
