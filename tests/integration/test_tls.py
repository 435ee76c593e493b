"""TLS and mTLS on real in-process servers, with certificates from the local CA generator.

The whole serving path over TLS (the scheduler link and the worker with client certificates),
and each way a handshake must fail: another CA, no client certificate, a certificate from
another CA, plaintext against TLS. The real grpcurl lists services with `-cacert`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.common import tokens
from gantry.common.grpc_server import RunningServer, channel, create_server, insecure_channel
from gantry.common.ids import new_id
from gantry.common.tls import ClientTls, IssuedFiles, ServerTls, create_local_ca, issue
from gantry.controlplane.app import ControlPlaneSettings, start_control_plane
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.platform.database import migrate_database
from gantry.scheduler.server import start_scheduler
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"


@dataclass(frozen=True)
class Pki:
    """A CA with a server certificate and a client certificate, in one directory."""

    directory: Path
    server: IssuedFiles
    client: IssuedFiles

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def server_tls(self, *, client_ca: Path | None = None) -> ServerTls:
        return ServerTls(
            cert_chain_file=self.server.cert_file,
            private_key_file=self.server.key_file,
            client_ca_file=client_ca,
        )

    def client_tls(self, *, with_certificate: bool = False) -> ClientTls:
        if not with_certificate:
            return ClientTls(ca_file=self.ca)
        return ClientTls(
            ca_file=self.ca, cert_file=self.client.cert_file, key_file=self.client.key_file
        )


def make_pki(directory: Path) -> Pki:
    create_local_ca(directory)
    return Pki(
        directory=directory,
        server=issue(directory, "server"),
        client=issue(directory, "client", client=True),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second CA that Gantry does not trust."""
    return make_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[RunningServer]:
    server = await create_server(
        listen="127.0.0.1:0",
        services=[],
        authenticator=None,
        tls=pki.server_tls(),
        health_listen="127.0.0.1:0",
    )
    yield server
    await server.stop(grace=0.2)


@pytest.fixture
async def mtls_server(pki: Pki) -> AsyncIterator[RunningServer]:
    server = await create_server(
        listen="127.0.0.1:0", services=[], authenticator=None, tls=pki.server_tls(client_ca=pki.ca)
    )
    yield server
    await server.stop(grace=0.2)


async def health_check(address: str, tls: ClientTls | None) -> int:
    async with channel(address, tls) as health_channel:
        response = await health_pb2_grpc.HealthStub(health_channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return int(response.status)


async def assert_refused(address: str, tls: ClientTls | None) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await health_check(address, tls)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


SERVING = health_pb2.HealthCheckResponse.SERVING


async def test_a_tls_server_answers_a_client_that_trusts_its_ca(
    tls_server: RunningServer, pki: Pki
) -> None:
    assert await health_check(f"127.0.0.1:{tls_server.port}", pki.client_tls()) == SERVING
    # The name in the certificate is checked too: localhost is in it, other names are not.
    assert await health_check(f"localhost:{tls_server.port}", pki.client_tls()) == SERVING
    renamed = ClientTls(ca_file=pki.ca, server_name="gantry.example")
    await assert_refused(f"127.0.0.1:{tls_server.port}", renamed)


async def test_a_client_that_trusts_another_ca_is_refused(
    tls_server: RunningServer, other_pki: Pki
) -> None:
    await assert_refused(f"127.0.0.1:{tls_server.port}", other_pki.client_tls())


async def test_a_plaintext_client_gets_nothing_from_a_tls_port(tls_server: RunningServer) -> None:
    await assert_refused(f"127.0.0.1:{tls_server.port}", None)


async def test_the_health_port_answers_plaintext_and_serves_nothing_else(
    tls_server: RunningServer,
) -> None:
    assert tls_server.health_port is not None
    address = f"127.0.0.1:{tls_server.health_port}"
    assert await health_check(address, None) == SERVING
    async with insecure_channel(address) as plain:
        list_nodes = plain.unary_unary(
            "/gantry.v1.ControlPlane/ListNodes",
            request_serializer=cp.ListNodesRequest.SerializeToString,
            response_deserializer=cp.ListNodesResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
            await list_nodes(cp.ListNodesRequest(), timeout=5)
    assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_mtls_answers_a_client_with_a_certificate_from_its_ca(
    mtls_server: RunningServer, pki: Pki
) -> None:
    address = f"127.0.0.1:{mtls_server.port}"
    assert await health_check(address, pki.client_tls(with_certificate=True)) == SERVING


async def test_mtls_refuses_a_client_without_a_certificate(
    mtls_server: RunningServer, pki: Pki
) -> None:
    await assert_refused(f"127.0.0.1:{mtls_server.port}", pki.client_tls())


async def test_mtls_refuses_a_certificate_from_another_ca(
    mtls_server: RunningServer, pki: Pki, other_pki: Pki
) -> None:
    foreign = ClientTls(
        ca_file=pki.ca, cert_file=other_pki.client.cert_file, key_file=other_pki.client.key_file
    )
    await assert_refused(f"127.0.0.1:{mtls_server.port}", foreign)


@pytest.mark.skipif(not GRPCURL.exists(), reason="grpcurl is installed by `make run`")
async def test_grpcurl_lists_the_services_over_tls_with_cacert(
    tls_server: RunningServer, pki: Pki
) -> None:
    address = f"127.0.0.1:{tls_server.port}"

    def grpcurl(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(GRPCURL), *arguments], capture_output=True, text=True, timeout=30, check=False
        )

    listed = await asyncio.to_thread(grpcurl, "-cacert", str(pki.ca), address, "list")
    assert listed.returncode == 0, listed.stderr
    assert "grpc.health.v1.Health" in listed.stdout.split()
    plaintext = await asyncio.to_thread(grpcurl, "-plaintext", address, "list")
    assert plaintext.returncode != 0
    # Without -cacert grpcurl trusts only the system roots, which do not know the local CA.
    untrusted = await asyncio.to_thread(grpcurl, address, "list")
    assert untrusted.returncode != 0


async def test_an_embed_crosses_tls_with_mtls_between_the_services(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path, pki: Pki
) -> None:
    """mTLS everywhere: the scheduler and its link from the control plane, the control plane's one
    port (operator and a real worker with client certificates), and an Embed through them."""
    pki_dir = pki.directory
    link = issue(pki_dir, "scheduler-link", client=True)
    worker = issue(pki_dir, "worker", client=True)
    service_token = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
    operator_token = tokens.mint_token(tokens.OPERATOR_TOKEN, new_id())
    scheduler_server, _ = await start_scheduler(
        listen="127.0.0.1:0", service_token=service_token, tls=pki.server_tls(client_ca=pki.ca)
    )
    await migrate_database(sqlite_url)
    control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen="127.0.0.1:0",
            database_url=sqlite_url,
            scheduler_address=f"127.0.0.1:{scheduler_server.port}",
            scheduler_token=service_token,
            bootstrap_operator_token=operator_token,
            reconciler=ReconcilerSettings(interval_s=0.2),
            tls=pki.server_tls(client_ca=pki.ca),
            scheduler_tls=ClientTls(
                ca_file=pki.ca, cert_file=link.cert_file, key_file=link.key_file
            ),
        )
    )
    artifact_root = tmp_path / "artifacts"
    artifact_root.mkdir()
    # mTLS on the control plane too: the operator needs a client certificate like the worker.
    operator_channel = channel(
        f"127.0.0.1:{control_plane.port}", pki.client_tls(with_certificate=True)
    )
    harness = Harness(
        scheduler_server=scheduler_server,
        control_plane=control_plane,
        channel=operator_channel,
        operator_token=operator_token,
        artifact_root=artifact_root,
        scheduler_token=service_token,
    )
    try:
        await control_plane.scheduler.wait_connected(10)  # the mTLS link is up
        key = await harness.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="tenant-a", name="tls"), metadata=harness.op_md
        )
        harness.api_key = key.api_key
        credential = await harness.register_node("node-tls")
        await harness.start_worker(
            credential,
            tls=ClientTls(ca_file=pki.ca, cert_file=worker.cert_file, key_file=worker.key_file),
        )
        artifact = await harness.register_model(tiny_model_dir, "tiny")
        deployment = await harness.deploy(artifact.artifact_set_id, "tiny")
        await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
        response = await harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=["over TLS"]), metadata=harness.client_md
        )
        assert len(response.vectors) == 1 and response.dim > 0
        assert np.isfinite(np.array(response.vectors[0].values)).all()
    finally:
        for agent, task in list(harness.workers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await agent.shutdown()
        await operator_channel.close()
        await control_plane.stop()
        await scheduler_server.stop(grace=0.5)
