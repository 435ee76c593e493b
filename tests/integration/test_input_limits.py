"""Explicit limits end to end: control plane, scheduler, worker and a real model host.

An input past the model's token limit is refused (INVALID_ARGUMENT / INPUT_TOO_LONG, naming the
input, its tokens and the limit) unless the request asks to truncate; an empty text is refused
before anything is scheduled; the server's own limits come back in the error's metadata; and a
burst of the client's bad inputs neither opens a breaker nor degrades the capability.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from gantry.common.inference_limits import InferenceLimits
from gantry.common.status import error_info_of
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry

CAPABILITY = "limits-tiny"
# 202 tokens with [CLS] and [SEP] for the tiny model (limit 128), in 1,200 characters.
OVERLONG = "hello world " * 100
LOWERED = InferenceLimits(max_inputs=4, max_input_chars=2_000, max_request_bytes=6_000)


async def _refusal(call) -> tuple[grpc.StatusCode, str, dict[str, str]]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None
    return caught.value.code(), info.reason, dict(info.metadata)


async def _serving(harness: Harness, model_dir: Path) -> str:
    await harness.start_worker(await harness.register_node("limits-node"))
    artifact = await harness.register_model(model_dir, CAPABILITY)
    deployment = await harness.deploy(artifact.artifact_set_id, CAPABILITY)
    await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    return deployment.deployment_id


def _direct(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    return model.encode(texts, convert_to_numpy=True)


async def test_overlong_empty_and_over_limit_inputs_are_refused_and_truncate_is_explicit(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url, root, inference=InferenceSettings(limits=LOWERED)
    ) as harness:
        deployment_id = await _serving(harness, tiny_model_dir)
        embed = harness.inference.Embed
        md = harness.client_md

        # Past the model's token limit: refused, naming the input, its tokens and the limit.
        code, reason, metadata = await _refusal(
            embed(inf.EmbedRequest(capability=CAPABILITY, inputs=["fine", OVERLONG]), metadata=md)
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INPUT_TOO_LONG")
        assert metadata["input_index"] == "1" and metadata["field"] == "inputs[1]"
        assert (metadata["tokens"], metadata["limit"]) == ("202", "128")

        # Asked for: cut to the limit, as sentence-transformers' own encode cuts it.
        texts = ["fine", OVERLONG]
        cut = await embed(
            inf.EmbedRequest(capability=CAPABILITY, inputs=texts, truncate=True), metadata=md
        )
        got = np.array([list(vector.values) for vector in cut.vectors], dtype=np.float32)
        np.testing.assert_allclose(got, _direct(tiny_model_dir, texts), rtol=1e-5, atol=1e-6)

        # An empty text: refused by the control plane, naming it.
        code, reason, metadata = await _refusal(
            embed(inf.EmbedRequest(capability=CAPABILITY, inputs=["a", ""]), metadata=md)
        )
        assert (code, reason, metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "EMPTY_INPUT",
            "inputs[1]",
        )

        # The server's lowered limits, each named with its value and the request's.
        too_many = ["x"] * (LOWERED.max_inputs + 1)
        too_many_chars = ["y" * (LOWERED.max_input_chars + 1)]
        too_many_bytes = ["é" * 1_600] * 2  # 6,400 bytes, each text within its characters
        for inputs, setting, field, limit, value in [
            (too_many, "max_inputs", "inputs", LOWERED.max_inputs, 5),
            (too_many_chars, "max_input_chars", "inputs[0]", LOWERED.max_input_chars, 2_001),
            (too_many_bytes, "max_request_bytes", "inputs", LOWERED.max_request_bytes, 6_400),
        ]:
            code, reason, metadata = await _refusal(
                embed(inf.EmbedRequest(capability=CAPABILITY, inputs=inputs), metadata=md)
            )
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
            assert metadata["setting"] == setting and metadata["field"] == field
            assert (metadata["limit"], metadata["value"]) == (str(limit), str(value))

        # A burst of the client's overlong inputs is not the runtime failing: past the breaker's
        # threshold (3) and the degradation's minimum (20 outcomes) it still serves, healthy.
        for _ in range(25):
            _, reason, _ = await _refusal(
                embed(inf.EmbedRequest(capability=CAPABILITY, inputs=[OVERLONG]), metadata=md)
            )
            assert reason == "INPUT_TOO_LONG"
        ok = await embed(inf.EmbedRequest(capability=CAPABILITY, inputs=["fine"]), metadata=md)
        assert len(ok.vectors) == 1
        degradation = harness.control_plane.reconciler.degradation
        degradation.evaluate()
        health = {state.capability: state for state in degradation.states()}[CAPABILITY]
        assert health.condition == "HEALTHY" and health.success_rate == 1.0
        deployment = await harness.deployment(deployment_id)
        assert deployment.state == cp.DEPLOYMENT_STATE_READY
        assert [residency.restart_count for residency in deployment.residencies] == [0]
