"""Adopted endpoints through crashes and outages, with real restarts and a real external server
(tests/fixtures/openai_stub_server.py, a separate process that Gantry never starts or stops):

- a worker restart (a new generation: its residency goes COLD) and a worker absence past the
  grace both end with the endpoint loaded again on its own node, never another; after an unload
  nothing brings it back;
- a control-plane restart adopts the running endpoint exactly (same resident, no second LOAD);
- a server that stops answering its pings makes the deployment DEGRADED (RUNTIME_UNRESPONSIVE),
  inference is refused typed at once, and it is READY and served again once the server answers.

Both stores run every scenario.
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

from gantry.common.status import error_info_of
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, restarted_control_plane, running_gantry, wait_for
from tests.integration.polling import wait_for_file

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-recovering"
CAPABILITY = "recovering-lm"
CREDENTIAL = "sk-recovery-0123456789abcdef"
PROMPT = "The weather"
# Heartbeats each second: a worker gone without a goodbye is stale after 3 s; one gone past
# 2 s loses its residencies (COLD). Short enough for a test, long enough for 2 shared cores.
RECONCILER = ReconcilerSettings(interval_s=0.2, heartbeat_interval_s=1.0, absence_grace_s=2.0)
# The worker pings its endpoint often, so an outage and a recovery show within a second or two.
FAST_PINGS = {"ping_interval_s": 0.3, "ping_timeout_s": 2.0, "reconnect_max_seconds": 0.5}


@dataclass(frozen=True)
class ExternalServer:
    pid: int
    port: int
    unavailable_file: Path  # while it exists, the server answers 503 to everything

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def external_server(
    tiny_causal_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExternalServer]:
    directory = tmp_path_factory.mktemp("external")
    credential_file, port_file = directory / "credential", directory / "port.json"
    credential_file.write_text(CREDENTIAL)
    unavailable_file = directory / "unavailable"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.fixtures.openai_stub_server"),
            *("--model-dir", str(tiny_causal_lm_dir), "--model", MODEL),
            *("--port-file", str(port_file), "--credential-file", str(credential_file)),
            *("--unavailable-file", str(unavailable_file)),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        wait_for_file(port_file, process, 60, "the external server to listen")
        port = json.loads(port_file.read_text())["port"]
        yield ExternalServer(pid=process.pid, port=port, unavailable_file=unavailable_file)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(
        database_url,
        tmp_path,
        reconciler=RECONCILER,
        endpoint_key_file=tmp_path / "endpoint.key",
    ) as running:
        yield running


def _completion(server: ExternalServer, max_tokens: int) -> str:
    """What the server itself answers, asked directly (greedy: one text)."""
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {CREDENTIAL}"},
        timeout=60,
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["text"])


async def _adopt(harness: Harness, server: ExternalServer, node: str) -> str:
    adopted = await harness.operator.AdoptEndpoint(
        cp.AdoptEndpointRequest(
            node=node,
            url=f"{server.url}/v1",
            model=MODEL,
            capability=CAPABILITY,
            credential=CREDENTIAL,
        ),
        metadata=harness.op_md,
    )
    await harness.wait_deployment(adopted.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=60)
    return adopted.deployment_id


async def _generate(harness: Harness) -> str:
    request = inf.GenerateRequest(capability=CAPABILITY, prompt=PROMPT, max_tokens=6)
    answered = await harness.inference.Generate(request, metadata=harness.client_md, timeout=60)
    return answered.text


async def _load_jobs(harness: Harness, deployment_id: str) -> list[cp.ServingJob]:
    listed = await harness.operator.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=deployment_id, page_size=100),
        metadata=harness.op_md,
    )
    return [job for job in listed.jobs if job.job_type == cp.SERVING_JOB_TYPE_LOAD]


async def _held_on(harness: Harness, node_id: str) -> list[str]:
    inventory = await harness.operator.GetInventory(
        cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
    )
    return [r.deployment_id for r in inventory.managed]


async def test_a_worker_restart_or_absence_loads_the_endpoint_again_on_its_own_node_only(
    harness: Harness, external_server: ExternalServer
) -> None:
    credential = await harness.register_node("endpoint-node")
    worker = await harness.start_worker(credential, **FAST_PINGS)
    # Another connected node with room: the endpoint must never be loaded there.
    await harness.start_worker(await harness.register_node("bystander"), **FAST_PINGS)
    deployment_id = await _adopt(harness, external_server, "endpoint-node")
    (residency,) = (await harness.deployment(deployment_id)).residencies
    expected = await asyncio.to_thread(_completion, external_server, 6)
    assert await _generate(harness) == expected

    # 1. A restart: a new generation holds nothing, so the residency is loaded again there.
    await harness.stop_worker(worker)
    worker = await harness.start_worker(credential, **FAST_PINGS)

    async def resident_under(generation: int) -> bool:
        row = await harness.deployment(deployment_id)
        return row.state == cp.DEPLOYMENT_STATE_READY and row.residencies[0].generation == (
            generation
        )

    await wait_for(lambda: resident_under(worker.generation), what="READY, new generation")
    assert await _generate(harness) == expected

    # 2. An absence past the grace: COLD (nothing routes to it), then back once it connects.
    await harness.stop_worker(worker)
    cold = await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_PENDING, timeout=30)
    assert cold.residencies[0].state == common_pb2.RESIDENCY_STATE_COLD
    worker = await harness.start_worker(credential, **FAST_PINGS)
    await wait_for(lambda: resident_under(worker.generation), what="READY after the absence")
    assert await _generate(harness) == expected
    back = await harness.deployment(deployment_id)
    assert [(r.residency_id, r.node_id) for r in back.residencies] == [
        (residency.residency_id, residency.node_id)
    ]
    bystander = next(
        n.node_id
        for n in (
            await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
        ).nodes
        if n.name == "bystander"
    )
    assert deployment_id not in await _held_on(harness, bystander)
    assert len(await _load_jobs(harness, deployment_id)) == 3  # adopt, restart, reconnect

    # 3. Unloaded by the operator: a restart does not bring it back.
    await harness.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=harness.op_md
    )
    await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED, timeout=30)
    await harness.stop_worker(worker)
    worker = await harness.start_worker(credential, **FAST_PINGS)
    reconciler = harness.control_plane.reconciler
    passes = reconciler.passes
    await wait_for(lambda: reconciler.passes >= passes + 5, what="five reconciler passes")
    assert (await harness.deployment(deployment_id)).state == cp.DEPLOYMENT_STATE_UNLOADED
    assert len(await _load_jobs(harness, deployment_id)) == 3
    assert worker.supervisor.residents.get(deployment_id) is None


async def test_a_control_plane_restart_adopts_the_running_endpoint_without_a_second_load(
    harness: Harness, external_server: ExternalServer, database_url: str, tmp_path: Path
) -> None:
    worker = await harness.start_worker(await harness.register_node("steady-node"), **FAST_PINGS)
    deployment_id = await _adopt(harness, external_server, "steady-node")
    before = (await harness.deployment(deployment_id)).residencies[0]
    held = worker.supervisor.residents.get(deployment_id)
    assert held is not None and held.adopted
    expected = await asyncio.to_thread(_completion, external_server, 6)

    async with restarted_control_plane(
        harness, database_url, reconciler=RECONCILER, endpoint_key_file=tmp_path / "endpoint.key"
    ):
        await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=60)
        after = (await harness.deployment(deployment_id)).residencies[0]
        assert (after.residency_id, after.generation, after.state) == (
            before.residency_id,
            before.generation,
            common_pb2.RESIDENCY_STATE_RESIDENT,
        )
        # Adopted as it was: the worker still holds the very same resident, and no LOAD was sent.
        assert worker.supervisor.residents.get(deployment_id) is held
        assert len(await _load_jobs(harness, deployment_id)) == 1
        assert await _generate(harness) == expected


async def test_an_endpoint_that_stops_answering_degrades_refuses_typed_and_heals_by_itself(
    harness: Harness, external_server: ExternalServer
) -> None:
    await harness.start_worker(await harness.register_node("flaky-node"), **FAST_PINGS)
    deployment_id = await _adopt(harness, external_server, "flaky-node")
    expected = await asyncio.to_thread(_completion, external_server, 6)
    assert await _generate(harness) == expected

    external_server.unavailable_file.touch()
    try:
        degraded = await harness.wait_deployment(
            deployment_id, cp.DEPLOYMENT_STATE_DEGRADED, timeout=30
        )
        assert degraded.last_failure.reason == "RUNTIME_UNRESPONSIVE"
        assert "503" in degraded.last_failure.message
        assert degraded.residencies[0].state == common_pb2.RESIDENCY_STATE_LOADING
        # Refused with a reason a client can act on, never held until its 60 s deadline (that
        # would end it DEADLINE_EXCEEDED).
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _generate(harness)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info_of(refused.value)
        assert info is not None and info.reason == "DEPLOYMENT_NOT_READY"
    finally:
        external_server.unavailable_file.unlink(missing_ok=True)

    healed = await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=30)
    # The deployment keeps its last failure as history; the residency serves with none.
    assert healed.residencies[0].state == common_pb2.RESIDENCY_STATE_RESIDENT
    assert not healed.residencies[0].last_failure.reason
    assert await _generate(harness) == expected
    assert len(await _load_jobs(harness, deployment_id)) == 1  # healed in place, not reloaded
    events = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(page_size=1000), metadata=harness.op_md
    )
    assert "endpoint.unresponsive" in {event.action for event in events.events}
