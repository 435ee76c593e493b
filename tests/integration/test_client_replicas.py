"""The documented client settings against real gRPC servers on port 0: a client of several
replicas loses no idempotent call when one of them is dead or dies under load, spreads its calls
round robin, retries a call answered UNAVAILABLE, and never retries a write.

The servers are small real servers with stub servicers (the front doors' own behaviour is tested
elsewhere); what is under test is the channel `client_channel` builds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from gantry.common.client_config import client_channel
from gantry.common.grpc_server import SERVER_OPTIONS
from gantry.common.tls import ClientTls, ServerTls, create_local_ca, issue
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc, inference_pb2, inference_pb2_grpc

REPLICA_SERVER = Path(__file__).with_name("replica_server.py")
DEADLINE_S = 30.0


def dead_address() -> str:
    """A port that was free a moment ago: nothing listens there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


class CountingInference(inference_pb2_grpc.InferenceServicer):
    """Answers every Embed with its name; the first `refuse_first` calls UNAVAILABLE."""

    def __init__(self, name: str, refuse_first: int = 0) -> None:
        self.name = name
        self.refuse_first = refuse_first
        self.calls = 0

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        self.calls += 1
        if self.calls <= self.refuse_first:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        return inference_pb2.EmbedResponse(node_id=self.name)


class RefusingControlPlane(control_plane_pb2_grpc.ControlPlaneServicer):
    """A read refused once then answered; writes refused every time. Counts each attempt."""

    def __init__(self) -> None:
        self.attempts: collections.Counter[str] = collections.Counter()

    async def GetNode(
        self, request: control_plane_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> control_plane_pb2.Node:
        self.attempts["GetNode"] += 1
        if self.attempts["GetNode"] == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the first attempt is refused")
        return control_plane_pb2.Node(node_id=request.node_id)

    async def DisableNode(
        self, request: control_plane_pb2.DisableNodeRequest, context: grpc.aio.ServicerContext
    ) -> control_plane_pb2.Node:
        self.attempts["DisableNode"] += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "refused")
        raise AssertionError("abort raises")

    async def CheckDeploymentHealth(
        self,
        request: control_plane_pb2.CheckDeploymentHealthRequest,
        context: grpc.aio.ServicerContext,
    ) -> control_plane_pb2.CheckDeploymentHealthResponse:
        self.attempts["CheckDeploymentHealth"] += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "refused")
        raise AssertionError("abort raises")


@contextlib.asynccontextmanager
async def serving(servicer: object, *, tls: ServerTls | None = None) -> AsyncIterator[str]:
    """A bare real server for `servicer` on a port of its own; its address."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    if isinstance(servicer, inference_pb2_grpc.InferenceServicer):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    else:
        control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(servicer, server)
    listen = "127.0.0.1:0"
    port = (
        server.add_insecure_port(listen)
        if tls is None
        else server.add_secure_port(listen, tls.credentials())
    )
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def steady_embeds(
    stub: inference_pb2_grpc.InferenceStub, *, calls: int, in_flight: int
) -> dict[int, inference_pb2.EmbedResponse | grpc.StatusCode]:
    """`calls` Embeds, `in_flight` at a time, each tagged with its index; every outcome."""
    outcomes: dict[int, inference_pb2.EmbedResponse | grpc.StatusCode] = {}
    indices = iter(range(calls))

    async def caller() -> None:
        for index in indices:
            request = inference_pb2.EmbedRequest(capability="c", inputs=[str(index)])
            try:
                outcomes[index] = await stub.Embed(request, timeout=DEADLINE_S)
            except grpc.aio.AioRpcError as error:
                outcomes[index] = error.code()

    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return outcomes


def failures(outcomes: dict[int, inference_pb2.EmbedResponse | grpc.StatusCode]) -> list[str]:
    return [f"{i}: {o}" for i, o in outcomes.items() if isinstance(o, grpc.StatusCode)]


async def test_a_dead_replica_in_the_list_costs_no_call() -> None:
    live = CountingInference("live")
    async with serving(live) as address:
        replicas = [dead_address(), address]
        async with client_channel(replicas, asynchronous=True) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            outcomes = await steady_embeds(stub, calls=200, in_flight=8)
    assert failures(outcomes) == []
    assert len(outcomes) == 200 and live.calls == 200


async def test_calls_go_round_robin_over_the_live_replicas() -> None:
    first, second = CountingInference("first"), CountingInference("second")
    async with serving(first) as address_a, serving(second) as address_b:
        async with client_channel([address_a, address_b], asynchronous=True) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            request = inference_pb2.EmbedRequest(capability="c", inputs=["x"])
            # Until both connections are up, every call goes to the one that is.
            async with asyncio.timeout(DEADLINE_S):
                while not (first.calls and second.calls):
                    await stub.Embed(request, timeout=DEADLINE_S)
            before = {"first": first.calls, "second": second.calls}
            served: collections.Counter[str] = collections.Counter()
            for _ in range(100):
                served[(await stub.Embed(request, timeout=DEADLINE_S)).node_id] += 1
    assert served["first"] + served["second"] == 100
    assert served["first"] >= 40 and served["second"] >= 40, served
    assert first.calls - before["first"] == served["first"]


async def test_an_inference_answered_unavailable_is_retried() -> None:
    flaky = CountingInference("flaky", refuse_first=2)
    async with serving(flaky) as address:
        async with client_channel([address], asynchronous=True) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            answer = await stub.Embed(
                inference_pb2.EmbedRequest(capability="c", inputs=["x"]), timeout=DEADLINE_S
            )
    assert answer.node_id == "flaky"
    assert flaky.calls == 3  # two refused attempts, then the answer


async def test_a_read_is_retried_and_a_write_is_not() -> None:
    control_plane = RefusingControlPlane()
    async with serving(control_plane) as address:
        async with client_channel([address], asynchronous=True) as channel:
            stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
            node = await stub.GetNode(
                control_plane_pb2.GetNodeRequest(node_id="n1"), timeout=DEADLINE_S
            )
            with pytest.raises(grpc.aio.AioRpcError) as disabled:
                await stub.DisableNode(
                    control_plane_pb2.DisableNodeRequest(node_id="n1"), timeout=DEADLINE_S
                )
            with pytest.raises(grpc.aio.AioRpcError) as checked:
                await stub.CheckDeploymentHealth(
                    control_plane_pb2.CheckDeploymentHealthRequest(deployment_id="d1"),
                    timeout=DEADLINE_S,
                )
    assert node.node_id == "n1" and control_plane.attempts["GetNode"] == 2
    assert disabled.value.code() == checked.value.code() == grpc.StatusCode.UNAVAILABLE
    # A write may have committed before its answer was lost: one attempt, never another.
    assert control_plane.attempts["DisableNode"] == 1
    assert control_plane.attempts["CheckDeploymentHealth"] == 1


def test_a_synchronous_channel_carries_the_same_policy() -> None:
    """The CLI's commands use grpc's synchronous API: the same retry reaches them."""

    async def run() -> int:
        control_plane = RefusingControlPlane()
        async with serving(control_plane) as address:

            def read() -> str:
                with client_channel([dead_address(), address]) as channel:
                    stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
                    request = control_plane_pb2.GetNodeRequest(node_id="n2")
                    return str(stub.GetNode(request, timeout=DEADLINE_S).node_id)

            assert await asyncio.to_thread(read) == "n2"
        return control_plane.attempts["GetNode"]

    assert asyncio.run(run()) == 2


async def test_tls_verifies_every_replica_of_a_list_as_the_first_address(tmp_path: Path) -> None:
    create_local_ca(tmp_path)
    server = issue(tmp_path, "server")  # valid for 127.0.0.1 and localhost
    server_tls = ServerTls(cert_chain_file=server.cert_file, private_key_file=server.key_file)
    first, second = CountingInference("first"), CountingInference("second")
    async with (
        serving(first, tls=server_tls) as address_a,
        serving(second, tls=server_tls) as address_b,
    ):
        tls = ClientTls(ca_file=tmp_path / "ca.pem")
        async with client_channel([address_a, address_b], tls=tls, asynchronous=True) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            request = inference_pb2.EmbedRequest(capability="c", inputs=["x"])
            async with asyncio.timeout(DEADLINE_S):
                while not (first.calls and second.calls):
                    await stub.Embed(request, timeout=DEADLINE_S)


@dataclass
class ReplicaProcess:
    """replica_server.py in a process of its own, and the call ids it holds unanswered."""

    process: asyncio.subprocess.Process
    address: str
    held: list[str] = field(default_factory=list)
    enough_held: asyncio.Event = field(default_factory=asyncio.Event)

    async def watch(self, wanted: int) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode().strip()
            if line.startswith("held "):
                self.held.append(line.removeprefix("held "))
                if len(self.held) >= wanted:
                    self.enough_held.set()


async def start_replica(name: str, hold_after: int) -> ReplicaProcess:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(REPLICA_SERVER), name, str(hold_after), stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    async with asyncio.timeout(DEADLINE_S):
        line = (await process.stdout.readline()).decode().strip()
    assert line.startswith("port "), line
    return ReplicaProcess(process, f"127.0.0.1:{line.removeprefix('port ')}")


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
async def test_killing_or_stopping_a_replica_under_steady_load_loses_no_call(
    fault: signal.Signals,
) -> None:
    # `doomed` answers 10 calls, then holds every call it gets: when it is SIGKILLed, at least
    # 16 calls are in flight on it (more than a retry throttle of 10 tokens would let through,
    # which stops retrying after 5 failures) and only a retry on `survivor` can answer them.
    # SIGSTOPped, it closes nothing: only the channel's keepalive (an unanswered ping) fails its
    # calls, UNAVAILABLE, before their deadline, so that they are retried.
    doomed = await start_replica("doomed", hold_after=10)
    survivor = await start_replica("survivor", hold_after=-1)
    watcher = asyncio.create_task(doomed.watch(wanted=16))

    async def kill_when_held() -> None:
        await doomed.enough_held.wait()
        doomed.process.send_signal(fault)

    killer = asyncio.create_task(kill_when_held())
    try:
        replicas = [doomed.address, survivor.address]
        async with client_channel(replicas, asynchronous=True) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            async with asyncio.timeout(DEADLINE_S * 2):
                outcomes = await steady_embeds(stub, calls=600, in_flight=48)
        assert killer.done(), "the load ended before the replica was killed"
    finally:
        for replica in (doomed, survivor):
            with contextlib.suppress(ProcessLookupError):
                replica.process.send_signal(signal.SIGCONT)
                replica.process.kill()
            await replica.process.wait()
        killer.cancel()
        await watcher
    assert failures(outcomes) == []
    answered = {
        str(i): o.node_id for i, o in outcomes.items() if isinstance(o, inference_pb2.EmbedResponse)
    }
    assert len(answered) == 600
    assert len(doomed.held) >= 16
    assert {answered[call] for call in doomed.held} == {"survivor"}
