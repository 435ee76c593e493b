"""Adopted endpoints end to end: an OpenAI-compatible server started by the test OUTSIDE Gantry
(tests/fixtures/openai_stub_server.py: a separate python process, stdlib http.server, answering
from the tiny causal LM through transformers) is adopted with AdoptEndpoint, becomes READY,
shows in GetInventory as adopted (pid 0), passes a deep health check, serves Generate and
GenerateStream, and is left running (same pid, still answering) after its deployment is unloaded
and deleted. Its bearer credential reaches the server and nothing else: not ListEndpoints,
GetInventory, the audit trail or the logs. Bad input is refused typed with nothing stored. Both
stores run every scenario.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.polling import wait_for_file

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-adopted"
CAPABILITY = "adopted-lm"
CREDENTIAL = "sk-adopted-0123456789abcdef"  # what the test server demands; must leak nowhere


@dataclass(frozen=True)
class ExternalServer:
    pid: int
    port: int
    seen_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.fixture(scope="module")
def external_server(
    tiny_causal_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExternalServer]:
    """The server Gantry adopts: started here, stopped here, never by Gantry."""
    directory = tmp_path_factory.mktemp("external")
    credential_file, port_file = directory / "credential", directory / "port.json"
    seen_file = directory / "seen.jsonl"
    credential_file.write_text(CREDENTIAL)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fixtures.openai_stub_server",
            *("--model-dir", str(tiny_causal_lm_dir), "--model", MODEL),
            *("--port-file", str(port_file), "--credential-file", str(credential_file)),
            *("--seen-file", str(seen_file)),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        wait_for_file(port_file, process, 60, "the external server to listen")
        port = json.loads(port_file.read_text())["port"]
        yield ExternalServer(pid=process.pid, port=port, seen_file=seen_file)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(database_url, tmp_path) as running:
        yield running


def _completion(server: ExternalServer, prompt: str, max_tokens: int) -> str:
    """What the server itself answers, asked directly (greedy: one text)."""
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {CREDENTIAL}"},
        timeout=60,
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["text"])


async def _node_id(harness: Harness, name: str) -> str:
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return next(node.node_id for node in listed.nodes if node.name == name)


async def test_an_external_server_is_adopted_routed_to_and_left_running_after_unload(
    harness: Harness, external_server: ExternalServer, caplog: pytest.LogCaptureFixture
) -> None:
    await harness.start_worker(await harness.register_node("adopt-node"))
    node_id = await _node_id(harness, "adopt-node")
    adopted = await harness.operator.AdoptEndpoint(
        cp.AdoptEndpointRequest(
            node="adopt-node",
            url=f"{external_server.url}/v1",
            model=MODEL,
            capability=CAPABILITY,
            credential=CREDENTIAL,
        ),
        metadata=harness.op_md,
    )
    assert adopted.adopted and adopted.node_id == node_id
    assert adopted.endpoint.url == external_server.url and adopted.endpoint.model == MODEL
    assert adopted.endpoint.has_credential
    deployment = await harness.wait_deployment(
        adopted.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=60
    )
    assert deployment.adopted and deployment.bound and not deployment.artifact_set_id
    assert deployment.residencies[0].adopted and deployment.residencies[0].pid == 0

    async def reported_resident() -> bool:
        inventory = await harness.operator.GetInventory(
            cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
        )
        return any(
            r.deployment_id == adopted.deployment_id
            and r.state == common_pb2.RESIDENCY_STATE_RESIDENT
            for r in inventory.managed
        )

    await wait_for(reported_resident, what="the worker's inventory naming the endpoint")
    inventory = await harness.operator.GetInventory(
        cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
    )
    (resident,) = [r for r in inventory.managed if r.deployment_id == adopted.deployment_id]
    assert resident.adopted and resident.pid == 0
    assert resident.endpoint_url == external_server.url
    assert resident.state == common_pb2.RESIDENCY_STATE_RESIDENT

    # Routed to it: Gantry's answer is the server's own (greedy), whole and streamed.
    expected = await asyncio.to_thread(_completion, external_server, "The weather", 12)
    request = inf.GenerateRequest(capability=CAPABILITY, prompt="The weather", max_tokens=12)
    answered = await harness.inference.Generate(request, metadata=harness.client_md, timeout=60)
    assert answered.text == expected and answered.completion_tokens >= 1
    chunks = [
        chunk
        async for chunk in harness.inference.GenerateStream(
            request, metadata=harness.client_md, timeout=60
        )
    ]
    assert "".join(c.text for c in chunks) == expected
    assert chunks[-1].finish_reason == answered.finish_reason

    # A deep health check: one real token from the server.
    checked = await harness.operator.CheckDeploymentHealth(
        cp.CheckDeploymentHealthRequest(deployment_id=adopted.deployment_id),
        metadata=harness.op_md,
    )
    (job,) = checked.jobs

    async def health_done() -> bool:
        row = await harness.operator.GetServingJob(
            cp.GetServingJobRequest(job_id=job.job_id), metadata=harness.op_md
        )
        return row.state == cp.SERVING_JOB_STATE_SUCCEEDED

    await wait_for(health_done, what="the deep health check", timeout=60)
    health = await harness.operator.GetServingJob(
        cp.GetServingJobRequest(job_id=job.job_id), metadata=harness.op_md
    )
    assert health.health.model.status == 1 and health.health.runtime.status == 1  # OK

    # The credential went to the server as a bearer token, and nowhere else.
    seen = [json.loads(line) for line in external_server.seen_file.read_text().splitlines()]
    assert any(entry["authorization"] == f"Bearer {CREDENTIAL}" for entry in seen)
    listed = await harness.operator.ListEndpoints(cp.ListEndpointsRequest(), metadata=harness.op_md)
    (endpoint,) = listed.endpoints
    assert endpoint.deployment_id == adopted.deployment_id and endpoint.has_credential
    events = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(page_size=1000), metadata=harness.op_md
    )
    assert "endpoint.adopt" in {event.action for event in events.events}
    for message in (listed, inventory, events, deployment, adopted):
        assert CREDENTIAL not in str(message)
        assert CREDENTIAL.encode() not in message.SerializeToString()

    # Unload forgets it; delete forgets the endpoint record. The server runs on, untouched.
    await harness.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=adopted.deployment_id), metadata=harness.op_md
    )
    await harness.wait_deployment(adopted.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED, timeout=30)
    await harness.operator.DeleteDeployment(
        cp.DeleteDeploymentRequest(deployment_id=adopted.deployment_id), metadata=harness.op_md
    )
    assert external_server.alive()
    assert await asyncio.to_thread(_completion, external_server, "The weather", 12) == expected

    async def forgotten() -> bool:
        inventory = await harness.operator.GetInventory(
            cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
        )
        return not [r for r in inventory.managed if r.deployment_id == adopted.deployment_id]

    await wait_for(forgotten, what="the worker forgetting the endpoint")
    assert not (
        await harness.operator.ListEndpoints(cp.ListEndpointsRequest(), metadata=harness.op_md)
    ).endpoints
    actions = [
        event.action
        for event in (
            await harness.operator.ListAuditEvents(
                cp.ListAuditEventsRequest(page_size=1000), metadata=harness.op_md
            )
        ).events
    ]
    assert actions.count("endpoint.forget") == 2  # on unload, and on delete
    assert CREDENTIAL not in caplog.text


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        ({"node": "no-such-node"}, grpc.StatusCode.NOT_FOUND, ""),
        ({"url": "ftp://127.0.0.1:1"}, grpc.StatusCode.INVALID_ARGUMENT, "url"),
        ({"url": "http://user:secret@127.0.0.1:1"}, grpc.StatusCode.INVALID_ARGUMENT, "url"),
        ({"url": "http://192.0.2.7:8080"}, grpc.StatusCode.INVALID_ARGUMENT, "url"),
        ({"url": "http://127.0.0.1:1/v1/completions"}, grpc.StatusCode.INVALID_ARGUMENT, "url"),
        ({"model": ""}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"capability": "no spaces"}, grpc.StatusCode.INVALID_ARGUMENT, "capability"),
    ],
)
async def test_bad_adoptions_are_refused_typed_with_nothing_stored(
    harness: Harness, change: dict[str, str], code: grpc.StatusCode, field: str
) -> None:
    await harness.register_node("refusing-node")
    request = {
        "node": "refusing-node",
        "url": "http://127.0.0.1:9/v1",
        "model": MODEL,
        "capability": CAPABILITY,
        **change,
    }
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await harness.operator.AdoptEndpoint(
            cp.AdoptEndpointRequest(**request), metadata=harness.op_md
        )
    assert refused.value.code() == code
    info = error_info_of(refused.value)
    assert info is not None and info.domain == "gantry.dev"
    if field:
        assert info.metadata["field"] == field
    assert "secret" not in (refused.value.details() or "")
    assert not (
        await harness.operator.ListEndpoints(cp.ListEndpointsRequest(), metadata=harness.op_md)
    ).endpoints
    assert not (
        await harness.operator.ListDeployments(cp.ListDeploymentsRequest(), metadata=harness.op_md)
    ).deployments


async def test_the_cli_adopts_from_a_credential_file_and_lists_without_it(
    sqlite_url: str,
    tmp_path: Path,
    external_server: ExternalServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`gantry endpoints adopt` takes the secret from a file (never argv) and prints the
    residency; `gantry endpoints list` shows the endpoint and no secret, as a table and JSON."""
    async with running_gantry(sqlite_url, tmp_path) as harness:
        await harness.start_worker(await harness.register_node("cli-node"))
        state = tmp_path / "state"
        state.mkdir()
        (state / "operator.token").write_text(harness.operator_token + "\n")
        credential_file = tmp_path / "server.token"
        credential_file.write_text(CREDENTIAL + "\n")
        base = ["--address", harness.address, "--state-dir", str(state)]
        capsys.readouterr()
        adopt = [
            *base,
            *("endpoints", "adopt", "--node", "cli-node", "--url", external_server.url),
            *("--model", MODEL, "--capability", "cli-lm", "--credential-file"),
            *(str(credential_file), "-o", "json"),
        ]
        # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
        assert await asyncio.to_thread(gantry_cli, adopt) == 0
        residency = json.loads(capsys.readouterr().out)
        assert residency["adopted"] is True and residency["endpoint"]["model"] == MODEL
        await harness.wait_deployment(
            residency["deployment_id"], cp.DEPLOYMENT_STATE_READY, timeout=60
        )
        assert await asyncio.to_thread(gantry_cli, [*base, "endpoints", "list", "-o", "json"]) == 0
        (listed,) = json.loads(capsys.readouterr().out)
        assert listed["url"] == external_server.url and listed["has_credential"] is True
        assert listed["state"] == "RESIDENCY_STATE_RESIDENT"
        assert await asyncio.to_thread(gantry_cli, [*base, "endpoints", "list"]) == 0
        table = capsys.readouterr()
        assert "cli-lm" in table.out and "sealed" in table.out
        assert CREDENTIAL not in table.out + table.err
