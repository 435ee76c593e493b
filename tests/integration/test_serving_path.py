"""Load -> embed -> unload through control plane, scheduler, worker and model host, and the ways
it can go wrong: bad input, tampered bytes, wrong secrets, a model host killed mid-request."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2, worker_gateway_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.fixtures.host_test_hooks import hosts_with_test_hooks
from tests.fixtures.vectors import assert_same_vectors
from tests.integration.harness import Harness, running_gantry, wait_for

READY = cp.DEPLOYMENT_STATE_READY


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def _serving(harness: Harness, model_dir: Path, capability: str = "tiny") -> str:
    credential = await harness.register_node(f"node-{capability}")
    await harness.start_worker(credential)
    artifact = await harness.register_model(model_dir, capability)
    deployment = await harness.deploy(artifact.artifact_set_id, capability)
    await harness.wait_deployment(deployment.deployment_id, READY)
    return deployment.deployment_id


def _direct(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    return model.encode(texts, convert_to_numpy=True)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


async def _code_and_reason(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info else ""


async def test_load_embed_unload_on_each_store(
    database_url: str,
    tmp_path: Path,
    tiny_model_dir: Path,
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        deployment_id = await _serving(harness, tiny_model_dir)
        texts = ["the gantry moves models", "a second sentence"]
        response = await harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=texts), metadata=harness.client_md
        )
        got = np.array([list(v.values) for v in response.vectors], dtype=np.float32)
        expected = _direct(tiny_model_dir, texts)
        assert got.shape == expected.shape and response.dim == expected.shape[1]
        for row, want in zip(got, expected, strict=True):
            assert _cosine(row, want) >= 0.9999

        packed = await harness.inference.Embed(
            inf.EmbedRequest(
                capability="tiny", inputs=texts, encoding=inf.VECTOR_ENCODING_FLOAT32_LE_BYTES
            ),
            metadata=harness.client_md,
        )
        unpacked = np.array(
            [struct.unpack(f"<{packed.dim}f", v.float32_le) for v in packed.vectors],
            dtype=np.float32,
        )
        assert_same_vectors(unpacked, got)  # two calls: to float rounding

        deployment = await harness.deployment(deployment_id)
        pid = deployment.residencies[0].pid
        assert pid > 0 and Path(f"/proc/{pid}").exists()
        await harness.operator.UnloadDeployment(
            cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=harness.op_md
        )
        unloaded = await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
        assert [r.state for r in unloaded.residencies] == [common_pb2.RESIDENCY_STATE_COLD]
        assert not Path(f"/proc/{pid}").exists()
        code, reason = await _code_and_reason(
            harness.inference.Embed(
                inf.EmbedRequest(capability="tiny", inputs=["x"]), metadata=harness.client_md
            )
        )
        # It will not come back by itself: not retryable.
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DEPLOYMENT_NOT_SERVING")


async def test_bad_embed_requests_get_typed_errors(gantry: Harness, tiny_model_dir: Path):
    await _serving(gantry, tiny_model_dir)
    embed = gantry.inference.Embed
    md = gantry.client_md
    assert await _code_and_reason(
        embed(inf.EmbedRequest(capability="nope", inputs=["x"]), metadata=md)
    ) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert await _code_and_reason(
        embed(inf.EmbedRequest(capability="tiny", inputs=[]), metadata=md)
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert await _code_and_reason(embed(inf.EmbedRequest(inputs=["x"]), metadata=md)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert await _code_and_reason(
        embed(inf.EmbedRequest(deployment_id="not-a-uuid", inputs=["x"]), metadata=md)
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    # The service still serves after all of that.
    ok = await embed(inf.EmbedRequest(capability="tiny", inputs=["fine"]), metadata=md)
    assert len(ok.vectors) == 1


async def test_an_unplaceable_deployment_stays_pending_then_is_placed_when_a_node_appears(
    gantry: Harness, tiny_model_dir: Path
):
    artifact = await gantry.register_model(tiny_model_dir, "idle")
    # Its gates were walked on a node that has gone since.
    probing = await gantry.start_worker(await gantry.register_node("probing-node"))
    approval = await gantry.approve(artifact.artifact_set_id, "idle")
    await gantry.stop_worker(probing)
    # No worker is connected: the scheduler finds no node, the deployment waits and says why.
    pending = await gantry.create_deployment(approval, "idle")
    assert pending.state == cp.DEPLOYMENT_STATE_PENDING
    assert pending.last_failure.reason == "NO_ELIGIBLE_NODE"
    code, reason = await _code_and_reason(
        gantry.inference.Embed(
            inf.EmbedRequest(capability="idle", inputs=["x"]), metadata=gantry.client_md
        )
    )
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "DEPLOYMENT_NOT_READY")
    # A node appears: the reconciler places the deployment without an operator.
    await gantry.start_worker(await gantry.register_node("late-node"))
    await gantry.wait_deployment(pending.deployment_id, cp.DEPLOYMENT_STATE_READY)
    ok = await gantry.inference.Embed(
        inf.EmbedRequest(capability="idle", inputs=["x"]), metadata=gantry.client_md
    )
    assert len(ok.vectors) == 1


async def test_a_tampered_artifact_is_refused_before_any_load(
    gantry: Harness, tiny_model_dir: Path
):
    credential = await gantry.register_node("tamper-node")
    agent = await gantry.start_worker(credential)
    artifact = await gantry.register_model(tiny_model_dir, "tampered")
    # The bytes change after they passed every gate: the load verifies them again.
    approval = await gantry.approve(artifact.artifact_set_id, "tampered")
    config = gantry.artifact_root / "tampered" / "config.json"
    config.write_text(config.read_text().replace("}", ', "x": 1}', 1))
    deployment = await gantry.create_deployment(approval, "tampered")
    failed = await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_FAILED)
    assert failed.last_failure.reason == "ARTIFACT_MISMATCH"
    assert "config.json" in failed.last_failure.message
    assert len(agent.residents) == 0
    # A FAILED deployment is not retried: asking it is FAILED_PRECONDITION, not retryable.
    assert await _code_and_reason(
        gantry.inference.Embed(
            inf.EmbedRequest(deployment_id=deployment.deployment_id, inputs=["x"]),
            metadata=gantry.client_md,
        )
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "DEPLOYMENT_NOT_SERVING")


async def test_extra_file_in_artifact_directory_is_a_mismatch(
    gantry: Harness, tiny_model_dir: Path
):
    credential = await gantry.register_node("extra-node")
    await gantry.start_worker(credential)
    artifact = await gantry.register_model(tiny_model_dir, "extra")
    approval = await gantry.approve(artifact.artifact_set_id, "extra")
    (gantry.artifact_root / "extra" / "smuggled.py").write_text("print('hi')\n")
    deployment = await gantry.create_deployment(approval, "extra")
    failed = await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_FAILED)
    assert failed.last_failure.reason == "ARTIFACT_MISMATCH"
    assert "extra smuggled.py" in failed.last_failure.message


async def test_wrong_secrets_are_unauthenticated_and_wrong_roles_denied(gantry: Harness):
    wrong_operator = gantry.operator_token[:-4] + "AAAA"
    assert await _code_and_reason(
        gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=auth_metadata(wrong_operator))
    ) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert await _code_and_reason(gantry.operator.ListNodes(cp.ListNodesRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
    )
    # A genuine client key is known but not allowed on operator calls, and the other way round;
    # a forged key of the other kind is not known at all.
    assert await _code_and_reason(
        gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.client_md)
    ) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    assert await _code_and_reason(
        gantry.inference.Embed(
            inf.EmbedRequest(capability="x", inputs=["x"]), metadata=gantry.op_md
        )
    ) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    assert await _code_and_reason(
        gantry.operator.ListNodes(
            cp.ListNodesRequest(), metadata=auth_metadata(gantry.api_key[:-4] + "AAAA")
        )
    ) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")

    credential = await gantry.register_node("cred-node")
    forged = credential[:-4] + "AAAA"
    stub = worker_gateway_pb2_grpc.WorkerGatewayStub(gantry.channel)

    async def hello():  # type: ignore[no-untyped-def]
        yield wg.WorkerMessage(generation=1, hello=wg.Hello())

    call = stub.Connect(hello(), metadata=auth_metadata(forged))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    nodes = await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
    assert {n.name: n.state for n in nodes.nodes}["cred-node"] == common_pb2.NODE_STATE_REGISTERED


async def test_an_impostor_hello_does_not_lock_out_the_real_worker(gantry: Harness):
    """Issue 26, item 6: a credential holder presenting a generation "from the future" used to
    take the node and have the real worker refused STALE_GENERATION for as long as the forged
    value stayed ahead of its clock. Generations are issued now: the impostor gets the next one
    (not the one it named), the real worker's stream is closed with STALE_GENERATION, and the
    real worker dials again and takes the node back at once."""
    credential = await gantry.register_node("fenced-node")
    agent = await gantry.start_worker(credential)
    real_generation = agent.generation
    stub = worker_gateway_pb2_grpc.WorkerGatewayStub(gantry.channel)
    hold = asyncio.Event()

    async def impostor():  # type: ignore[no-untyped-def]
        yield wg.WorkerMessage(generation=2**63 - 1, hello=wg.Hello())
        await hold.wait()

    call = stub.Connect(impostor(), metadata=auth_metadata(credential))
    first = await call.read()
    assert first.WhichOneof("kind") == "welcome"
    issued = first.welcome.accepted_generation
    assert real_generation < issued < 2**63 - 1  # the next one, not the one it named
    # The real worker is told, dials again, and wins: a newer generation than the impostor's.
    await wait_for(lambda: agent.generation > issued, what="the real worker to take it back")
    await wait_for(lambda: agent.connected.is_set(), what="the real worker connected again")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while await call.read() is not grpc.aio.EOF:
            pass
    assert error_info_of(caught.value).reason == "STALE_GENERATION"  # type: ignore[union-attr]
    hold.set()
    nodes = await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
    node = {n.name: n for n in nodes.nodes}["fenced-node"]
    assert node.generation == agent.generation and node.state == common_pb2.NODE_STATE_CONNECTED


async def test_model_host_killed_mid_request_fails_fast_then_serves_again_on_its_own(
    gantry: Harness,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    hosts_with_test_hooks(monkeypatch)  # the worker's hosts take the magic inputs
    deployment_id = await _serving(gantry, tiny_model_dir, "crashy")
    pid = (await gantry.deployment(deployment_id)).residencies[0].pid
    agent = gantry.workers[0][0]
    call = gantry.inference.Embed(
        inf.EmbedRequest(capability="crashy", inputs=["__gantry_test_hook__:hang"]),
        metadata=gantry.client_md,
        timeout=60,
    )
    request = asyncio.ensure_future(call)

    def hanging_in_the_child() -> bool:
        resident = agent.residents.get(deployment_id)
        host = resident.host if resident is not None else None
        tail = host.stderr_tail() if host is not None else []  # type: ignore[attr-defined]
        return any("test hook: hanging" in line for line in tail)

    await wait_for(hanging_in_the_child, what="the request held in the model host")
    assert not request.done()
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    code, reason = await _code_and_reason(request)
    # Failed by the host's exit, not held to the call's 60 s deadline (DEADLINE_EXCEEDED).
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "RUNTIME_CRASHED")
    # No operator action: the worker restarts the host in place and the deployment heals.
    latest: list[cp.Deployment] = []

    async def healed_with_a_new_host() -> bool:
        latest[:] = [await gantry.deployment(deployment_id)]
        residency = latest[0].residencies[0]
        return latest[0].state == cp.DEPLOYMENT_STATE_READY and residency.pid not in (0, pid)

    await wait_for(healed_with_a_new_host, timeout=90, what="READY on a new host", last=latest)
    assert latest[0].residencies[0].restart_count == 1
    served_again = time.monotonic() - started
    ok = await gantry.inference.Embed(
        inf.EmbedRequest(capability="crashy", inputs=["again"]), metadata=gantry.client_md
    )
    assert len(ok.vectors) == 1
    print(f"model-host kill -9 to serving again: {served_again:.1f}s")
    report = await gantry.operator.CheckInvariants(
        cp.CheckInvariantsRequest(), metadata=gantry.op_md
    )
    assert report.all_hold, report


async def test_operator_inputs_are_validated_and_nothing_is_stored(gantry: Harness):
    register = gantry.operator.RegisterArtifactSet
    entry = {"size_bytes": 1, "sha256": "0" * 64}
    for location, path in [("../escape", "a"), ("/abs", "a"), ("ok", "../a"), ("ok", "/etc/x")]:
        code, reason = await _code_and_reason(
            register(
                cp.RegisterArtifactSetRequest(
                    name="bad", location=location, manifest=[{"path": path, **entry}]
                ),
                metadata=gantry.op_md,
            )
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "ARTIFACT_PATH_INVALID")
    code, reason = await _code_and_reason(
        register(cp.RegisterArtifactSetRequest(name="empty", location="ok"), metadata=gantry.op_md)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "ARTIFACT_PATH_INVALID")
    listed = await gantry.operator.ListArtifactSets(
        cp.ListArtifactSetsRequest(), metadata=gantry.op_md
    )
    assert list(listed.artifact_sets) == []
    missing = "00000000-0000-4000-8000-000000000000"
    assert await _code_and_reason(
        gantry.operator.GetDeployment(
            cp.GetDeploymentRequest(deployment_id=missing), metadata=gantry.op_md
        )
    ) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert await _code_and_reason(
        gantry.operator.CreateDeployment(
            cp.CreateDeploymentRequest(approval_id=missing, capability="c"),
            metadata=gantry.op_md,
        )
    ) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


async def test_list_rpcs_page(gantry: Harness):
    for index in range(5):
        await gantry.register_node(f"page-{index}")
    seen: list[str] = []
    token = ""
    while True:
        page = await gantry.operator.ListNodes(
            cp.ListNodesRequest(page_size=2, page_token=token), metadata=gantry.op_md
        )
        assert len(page.nodes) <= 2
        seen += [n.name for n in page.nodes]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == [f"page-{i}" for i in range(5)]


async def test_worker_restart_reloads_its_deployment_under_a_new_generation(
    gantry: Harness,
    tiny_model_dir: Path,
):
    credential = await gantry.register_node("restart-node")
    agent = await gantry.start_worker(credential)
    artifact = await gantry.register_model(tiny_model_dir, "restart")
    deployment = await gantry.deploy(artifact.artifact_set_id, "restart")
    ready = await gantry.wait_deployment(deployment.deployment_id, READY)
    old_pid = ready.residencies[0].pid
    await gantry.stop_worker(agent)  # its children stop with it
    assert not Path(f"/proc/{old_pid}").exists()
    fresh = await gantry.start_worker(credential)
    assert fresh.generation > agent.generation

    async def reloaded() -> bool:
        d = await gantry.deployment(deployment.deployment_id)
        residency = d.residencies[0]
        return (
            d.state == READY
            and residency.state == common_pb2.RESIDENCY_STATE_RESIDENT
            and residency.generation == fresh.generation
        )

    await wait_for(reloaded, timeout=60, what="the deployment to load again on the new generation")
    new_pid = (await gantry.deployment(deployment.deployment_id)).residencies[0].pid
    assert new_pid != old_pid and Path(f"/proc/{new_pid}").exists()
    response = await gantry.inference.Embed(
        inf.EmbedRequest(capability="restart", inputs=["again"]), metadata=gantry.client_md
    )
    assert len(response.vectors) == 1


async def test_deep_health_on_demand_reports_each_layer(gantry: Harness, tiny_model_dir: Path):
    deployment_id = await _serving(gantry, tiny_model_dir, "healthy")
    response = await gantry.operator.CheckDeploymentHealth(
        cp.CheckDeploymentHealthRequest(deployment_id=deployment_id), metadata=gantry.op_md
    )
    assert [job.job_type for job in response.jobs] == [cp.SERVING_JOB_TYPE_HEALTH]
    latest: list[cp.ServingJob] = []

    async def done() -> bool:
        latest[:] = [
            await gantry.operator.GetServingJob(
                cp.GetServingJobRequest(job_id=response.jobs[0].job_id), metadata=gantry.op_md
            )
        ]
        return latest[0].state == cp.SERVING_JOB_STATE_SUCCEEDED

    await wait_for(done, what="the HEALTH job settled", last=latest)
    report = latest[0].health
    assert report.process.status == wg.HEALTH_STATUS_OK
    assert report.runtime.status == wg.HEALTH_STATUS_OK
    assert report.model.status == wg.HEALTH_STATUS_OK  # a real forward pass
    # Nothing resident: a typed refusal, not an empty answer.
    await gantry.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=gantry.op_md
    )
    await gantry.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gantry.operator.CheckDeploymentHealth(
            cp.CheckDeploymentHealthRequest(deployment_id=deployment_id), metadata=gantry.op_md
        )
    assert error_info_of(caught.value).reason == "DEPLOYMENT_NOT_READY"  # type: ignore[union-attr]
