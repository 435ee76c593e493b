"""A CUDA out-of-memory at invoke, end to end: client, control plane, scheduler, worker and a real
model host whose forward pass raises the fake at the torch.cuda boundary (`testing_hooks`).

The client reads RESOURCE_EXHAUSTED / INVOKE_OOM; the scheduler's breakers do not count it (the
host answered, and serves the next call on the same process), while the capability's degradation
signal does. An INVOKE_FAILED beside it is counted as the runtime's failure, so the counters are
shown to move.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.worker.model_host import testing_hooks
from gantry.worker.model_host.serving import TEST_HOOK_FAIL_INPUT
from tests.fixtures.host_test_hooks import hosts_with_test_hooks
from tests.integration.generation_support import settled
from tests.integration.harness import Harness, running_gantry

CAPABILITY = "oomy"


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def _reason(harness: Harness, text: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.inference.Embed(
            inf.EmbedRequest(capability=CAPABILITY, inputs=[text]), metadata=harness.client_md
        )
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info else ""


async def test_an_invoke_oom_reaches_the_client_typed_opens_no_breaker_and_degrades(
    gantry: Harness, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts_with_test_hooks(monkeypatch)
    await gantry.start_worker(await gantry.register_node("gpu-node"))
    artifact = await gantry.register_model(tiny_model_dir, CAPABILITY)
    deployment = await gantry.deploy(artifact.artifact_set_id, CAPABILITY)
    await gantry.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    pid = (await gantry.deployment(deployment.deployment_id)).residencies[0].pid

    # Past the breaker's threshold (3): were INVOKE_OOM counted as the runtime's failure, the
    # one residency's breaker would be open and the calls below refused CIRCUIT_OPEN.
    for _ in range(4):
        assert await _reason(gantry, testing_hooks.CUDA_OOM_INPUT) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "INVOKE_OOM",
        )
    assert await _reason(gantry, TEST_HOOK_FAIL_INPUT) == (
        grpc.StatusCode.INTERNAL,
        "INVOKE_FAILED",
    )
    served = await gantry.inference.Embed(
        inf.EmbedRequest(capability=CAPABILITY, inputs=["after the ooms"]),
        metadata=gantry.client_md,
    )
    assert len(served.vectors) == 1

    snapshot = await settled(gantry, "every call finished", infra_failures_total=1)
    assert list(snapshot.breakers) == []  # the INVOKE_FAILED's count reset by the success
    # The same host answered all of it: nothing crashed or was restarted.
    after = await gantry.deployment(deployment.deployment_id)
    assert after.state == cp.DEPLOYMENT_STATE_READY
    assert [(r.pid, r.restart_count) for r in after.residencies] == [(pid, 0)]

    degradation = gantry.control_plane.reconciler.degradation
    degradation.evaluate()
    health = {state.capability: state for state in degradation.states()}[CAPABILITY]
    # Four INVOKE_OOMs and the INVOKE_FAILED counted as failures, the last call as a success.
    assert health.outcomes == 6
    assert health.success_rate == pytest.approx(1 / 6)
