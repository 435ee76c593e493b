"""The pure parts of adopted endpoints: URL checks, credential sealing, the reconciler's skip, the
admin refusals, and the worker's adopted host against an in-memory HTTP transport (no process)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.admin_rules import adopted_refusal
from gantry.controlplane.deployments.placement import missing_replicas
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.endpoints.url_rules import (
    OwnListeners,
    check_credential,
    check_endpoint_url,
    check_not_own_listener,
)
from gantry.controlplane.platform.models import Deployment
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.adopted_endpoint import AdoptedEndpoint, adopt_endpoint
from gantry.worker.supervision import SupervisionSettings, Supervisor


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("https://localhost:8443/v1/", "https://localhost:8443"),
        ("http://[::1]:9000", "http://[::1]:9000"),
        ("http://127.9.9.9", "http://127.9.9.9"),
        ("http://gpu-node-7.example:8000/v1", "http://gpu-node-7.example:8000"),  # its hostname
    ],
)
def test_a_loopback_or_own_host_url_is_kept_as_a_base(url: str, base: str) -> None:
    assert check_endpoint_url(url, node_hostname="GPU-node-7.example").base == base


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://127.0.0.1:21",
        "127.0.0.1:8080",
        "http://user:hunter2@127.0.0.1:8080",
        "http://token@127.0.0.1:8080",
        "http://192.0.2.10:8080",
        "http://other-node:8080",
        "http://127.0.0.1:8080/v1/completions",
        "http://127.0.0.1:8080/?x=1",
        "http://127.0.0.1:8080/#frag",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:8080/ v1",
    ],
)
def test_any_other_url_is_invalid_argument_naming_the_url(url: str) -> None:
    with pytest.raises(GantryError) as refused:
        check_endpoint_url(url, node_hostname="gpu-node-7")
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert refused.value.metadata["field"] == "url"
    assert "hunter2" not in refused.value.message


OWN = OwnListeners(ports=frozenset({50051, 8080, 80}), hostname="cp-host")


@pytest.mark.parametrize(
    ("url", "node_hostname"),
    [
        ("http://127.0.0.1:50051", "cp-host"),  # the gRPC port (ControlPlane, Inference, OIP)
        ("http://localhost:8080/v1", "CP-HOST"),  # the HTTP door, hostname in any case
        ("https://[::1]:8080", "cp-host"),
        ("http://127.3.2.1:8080", "cp-host"),  # all of 127/8 is this machine
        ("http://cp-host:50051", "cp-host"),  # its hostname
        ("http://127.0.0.1", "cp-host"),  # no port: http's 80
        ("http://127.0.0.1:8080", ""),  # a node that has not said where it runs: taken as here
    ],
)
def test_a_url_naming_the_control_planes_own_listener_is_refused(
    url: str, node_hostname: str
) -> None:
    checked = check_endpoint_url(url, node_hostname=node_hostname)
    with pytest.raises(GantryError) as refused:
        check_not_own_listener(checked, node_hostname=node_hostname, own=OWN)
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert refused.value.metadata["field"] == "url"
    assert refused.value.metadata["port"] == str(checked.effective_port)
    assert "own front doors" in refused.value.message


@pytest.mark.parametrize(
    ("url", "node_hostname", "own"),
    [
        ("http://127.0.0.1:8000", "cp-host", OWN),  # another port on this machine
        ("https://127.0.0.1", "cp-host", OWN),  # https's 443 is not one of ours
        ("http://127.0.0.1:8080", "gpu-node-7", OWN),  # the node's loopback is another machine
        ("http://gpu-node-7:50051", "gpu-node-7", OWN),
        ("http://127.0.0.1:8080", "cp-host", OwnListeners()),  # no listener known
    ],
)
def test_a_url_elsewhere_or_on_another_port_is_not_ours(
    url: str, node_hostname: str, own: OwnListeners
) -> None:
    checked = check_endpoint_url(url, node_hostname=node_hostname)
    check_not_own_listener(checked, node_hostname=node_hostname, own=own)


def test_a_credential_must_be_a_header_safe_token() -> None:
    assert check_credential("sk-abc.DEF_123") == "sk-abc.DEF_123"
    for bad in ("with space", "line\nbreak", "x" * 5000):
        with pytest.raises(GantryError):
            check_credential(bad)


def test_sealing_round_trips_and_another_key_cannot_open_it(tmp_path: Path) -> None:
    key_file = tmp_path / "endpoint-sealing.key"
    sealer = CredentialSealer.from_key_file(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    sealed = sealer.seal("sk-secret")
    assert "sk-secret" not in sealed
    # The same file later (a restart) opens what was sealed; it is never re-minted.
    assert CredentialSealer.from_key_file(key_file).open(sealed, endpoint_id="e") == "sk-secret"
    assert sealer.seal("") == "" and sealer.open("", endpoint_id="e") == ""
    with pytest.raises(GantryError) as refused:
        CredentialSealer.ephemeral().open(sealed, endpoint_id="e")
    assert refused.value.reason == "LOAD_FAILED"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660, 0o620])
def test_a_key_file_others_can_read_or_its_group_rewrite_is_refused(
    tmp_path: Path, mode: int
) -> None:
    key_file = tmp_path / "key"
    CredentialSealer.from_key_file(key_file)
    os.chmod(key_file, mode)
    with pytest.raises(GantryError):
        CredentialSealer.from_key_file(key_file)


@pytest.mark.parametrize("mode", [0o640, 0o440, 0o400])
def test_a_key_file_the_service_s_group_reads_is_accepted(tmp_path: Path, mode: int) -> None:
    # What deploy/ hands the control plane: a compose secret (0640) or a Secret volume (0440).
    key_file = tmp_path / "key"
    sealed = CredentialSealer.from_key_file(key_file).seal("sk-secret")
    os.chmod(key_file, mode)
    assert CredentialSealer.from_key_file(key_file).open(sealed, endpoint_id="e") == "sk-secret"


async def test_the_reconciler_never_places_an_adopted_deployment() -> None:
    adopted = Deployment(deployment_id="d", origin="adopted", replicas=3)
    # Decided before any read: the session is never touched.
    assert await missing_replicas(cast(Any, None), adopted) == 0


def test_an_adopted_deployment_is_never_restarted_or_scaled() -> None:
    refusal = adopted_refusal("d", origin="adopted", operation="scaled")
    assert refusal is not None and refusal.reason == "INVALID_STATE_TRANSITION"
    assert adopted_refusal("d", origin="pipeline", operation="scaled") is None


def _server(*, models: list[str], seen: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": name} for name in models]})
        return httpx.Response(404, json={"error": {"message": "no"}})

    return httpx.MockTransport(answer)


def _endpoint(transport: httpx.AsyncBaseTransport) -> AdoptedEndpoint:
    return AdoptedEndpoint(
        deployment_id="d",
        endpoint=wg.EndpointSpec(url="http://127.0.0.1:1", model="m", credential="tok"),
        adapter=common_pb2.AdapterSettings(max_concurrency=2),
        transport=transport,
    )


async def test_the_adopted_host_pings_with_the_bearer_token_and_forgetting_sends_nothing() -> None:
    seen: list[httpx.Request] = []
    host = _endpoint(_server(models=["m"], seen=seen))
    await host.ping(timeout_s=1)
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert host.pid == 0 and host.rss_bytes() == 0
    evidence = await host.stop()
    assert evidence.pid == 0 and evidence.process_exited
    assert len(seen) == 1  # nothing was sent to the server on unload
    assert not host.alive


async def test_a_ping_that_misses_the_model_or_hangs_is_unresponsive_never_a_kill() -> None:
    host = _endpoint(_server(models=["other"], seen=[]))
    with pytest.raises(GantryError) as refused:
        await host.ping(timeout_s=1)
    assert refused.value.reason == "RUNTIME_UNRESPONSIVE"

    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()  # never set: only the ping's timeout, cancelling, ends it
        raise AssertionError("not reached")

    hung = _endpoint(httpx.MockTransport(hang))
    with pytest.raises(GantryError) as timed_out:
        await hung.ping(timeout_s=0.05)
    # Not DEADLINE_EXCEEDED: supervision kills a host only on that.
    assert timed_out.value.reason == "RUNTIME_UNRESPONSIVE"


async def test_supervision_marks_a_failing_adopted_server_unhealthy_and_keeps_it() -> None:
    changes: list[None] = []
    supervisor = Supervisor(SupervisionSettings(), on_change=lambda: changes.append(None))
    models = ["m"]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"id": name} for name in models]})

    spec = wg.LoadSpec(
        deployment_id="d", endpoint=wg.EndpointSpec(url="http://127.0.0.1:1", model="m")
    )
    evidence = await adopt_endpoint(
        spec,
        admit=lambda deployment_id, facts, host: supervisor.adopt(
            deployment_id, facts, host, endpoint_url=host.url
        ),
        check_timeout_s=1,
        transport=httpx.MockTransport(answer),
    )
    assert evidence.bytes_unavailable.startswith("UNAVAILABLE")
    resident = supervisor.residents.get("d")
    assert resident is not None and resident.adopted
    models.clear()  # the server stops listing the model
    await supervisor.check_liveness()
    assert resident.health is not None
    assert resident.health.runtime.status == wg.HEALTH_STATUS_FAILED
    assert supervisor.residents.get("d") is resident and resident.restart_count == 0
    proto = resident.to_proto()
    assert proto.adopted and proto.pid == 0 and proto.endpoint_url == "http://127.0.0.1:1"
    await supervisor.unload("d")
    assert supervisor.residents.get("d") is None


# What an adopted server may say in an error: its paths, another caller's prompt, a traceback.
SECRET = "Traceback: /srv/secret-weights/model.gguf prompt='the other tenant wrote this'"


def _answering(status: int, body: dict[str, Any] | str) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, {"error": {"message": SECRET}}, "INVOKE_FAILED"),
        (503, SECRET, "INVOKE_FAILED"),
        (400, {"detail": SECRET}, "INVALID_PAYLOAD"),  # about the request: the client's
    ],
)
async def test_an_adopted_servers_refusal_reaches_the_caller_as_its_status_only(
    caplog: pytest.LogCaptureFixture,
    stream: bool,
    status: int,
    body: dict[str, Any] | str,
    reason: str,
) -> None:
    host = _endpoint(_answering(status, body))
    with pytest.raises(GantryError) as refused:
        await host.generate(
            wg.GeneratePayload(prompt="hi", max_tokens=4, stream=stream),
            trace_context={},
            timeout_s=5,
        )
    assert refused.value.reason == reason
    assert f"the adopted server answered generate with HTTP {status}" in refused.value.message
    assert refused.value.metadata["upstream_status"] == str(status)
    assert "secret" not in str(refused.value) + str(refused.value.metadata)
    # The server's words, cut short, are in the worker's log for its operator.
    assert "/srv/secret-weights" in caplog.text and f"HTTP {status}" in caplog.text


async def test_an_adopted_servers_error_event_or_broken_reply_is_named_not_quoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event = json.dumps({"error": {"message": SECRET}})

    def mid_stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=f"data: {event}\n\n")

    host = _endpoint(httpx.MockTransport(mid_stream))
    with pytest.raises(GantryError) as failed:
        await host.generate(
            wg.GeneratePayload(prompt="hi", stream=True), trace_context={}, timeout_s=5
        )
    assert failed.value.reason == "INVOKE_FAILED"
    assert "an error event mid-stream" in failed.value.message
    assert "upstream_status" not in failed.value.metadata  # no status to name
    assert "secret" not in failed.value.message

    def garbled(request: httpx.Request) -> httpx.Response:
        # What an HTTP parser says of a bad reply quotes the server's bytes.
        raise httpx.RemoteProtocolError(f"illegal status line: {SECRET!r}", request=request)

    broken = _endpoint(httpx.MockTransport(garbled))
    with pytest.raises(GantryError) as refused:
        await broken.generate(wg.GeneratePayload(prompt="hi"), trace_context={}, timeout_s=5)
    assert refused.value.reason == "INVOKE_FAILED"
    assert refused.value.message == "the adopted server failed generate: RemoteProtocolError"
    assert caplog.text.count("/srv/secret-weights") == 2  # both, in the log only


class _Endless(httpx.AsyncByteStream):
    """A body that never ends; `closed` once its reader lets go of it (httpx closes it)."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n'

    async def aclose(self) -> None:
        self.closed = True


async def test_an_endless_adopted_stream_is_cut_at_max_tokens_and_closed() -> None:
    endless = _Endless()

    def answer(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        if sent["stream"]:
            return httpx.Response(200, stream=endless)
        # The prompt's count, asked once the stream ended (it streamed no usage).
        usage = {"prompt_tokens": 3, "completion_tokens": 1}
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    host = _endpoint(httpx.MockTransport(answer))
    deltas: list[wg.GenerateDelta] = []
    result = await host.generate(
        wg.GeneratePayload(prompt="hi", max_tokens=5, stream=True),
        trace_context={},
        timeout_s=30,
        on_delta=deltas.append,
    )
    assert result.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (result.text, result.completion_tokens, result.prompt_tokens) == ("xxxxx", 5, 3)
    assert [delta.completion_tokens for delta in deltas] == [1, 2, 3, 4, 5]
    assert endless.closed


class _Comments(httpx.AsyncByteStream):
    """A body of SSE comments without end: no event, so nothing to count; only time ends it."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(0)  # a socket's read gives the loop a turn; so does this
            yield b": still here\n\n"


async def test_a_stream_without_events_ends_at_the_calls_deadline() -> None:
    host = _endpoint(httpx.MockTransport(lambda request: httpx.Response(200, stream=_Comments())))
    with pytest.raises(GantryError) as timed_out:
        await host.generate(
            wg.GeneratePayload(prompt="hi", max_tokens=5, stream=True),
            trace_context={},
            timeout_s=0.2,
        )
    assert timed_out.value.reason == "DEADLINE_EXCEEDED"


async def test_a_server_that_answers_as_gantry_is_never_adopted() -> None:
    # Gantry's own HTTP door lists each capability with its `gantry` member.
    listed = {"data": [{"id": "m", "gantry": {"deployment_id": "d-1", "state": "READY"}}]}
    spec = wg.LoadSpec(
        deployment_id="d", endpoint=wg.EndpointSpec(url="http://127.0.0.1:1", model="m")
    )
    with pytest.raises(GantryError) as refused:
        await adopt_endpoint(
            spec,
            admit=lambda *_: pytest.fail("admitted"),
            check_timeout_s=1,
            transport=_answering(200, listed),
        )
    assert refused.value.reason == "LOAD_FAILED"
    assert "answers as a Gantry control plane" in refused.value.message


@pytest.mark.parametrize(
    "data",
    [
        [{"index": 0}],  # no embedding
        [{"index": 0, "embedding": ["a", "b"]}],  # not numbers
        ["not an object"],
    ],
)
async def test_malformed_embeddings_are_a_typed_failure(data: list[object]) -> None:
    host = _endpoint(_answering(200, {"object": "list", "data": data}))
    with pytest.raises(GantryError) as failed:
        await host.embed(["x"], trace_context={}, timeout_s=5)
    assert failed.value.reason == "INVOKE_FAILED"
