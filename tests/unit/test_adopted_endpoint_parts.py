"""The pure parts of adopted endpoints: URL checks, credential sealing, the reconciler's skip, the
admin refusals, and the worker's adopted host against an in-memory HTTP transport (no process)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.admin_rules import adopted_refusal
from gantry.controlplane.deployments.placement import missing_replicas
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.endpoints.url_rules import check_credential, check_endpoint_url
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
        await asyncio.sleep(10)
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
