"""The Open Inference Protocol (KServe v2 / Triton gRPC) on the control plane's port, driven by the
real tritonclient (from the clients environment, in a child process) and by grpcurl through
reflection, against an in-process Gantry serving the tiny sentence embedder, on SQLite and
PostgreSQL: the vectors are gantry.v1.Inference.Embed's, and a refusal carries Gantry's reason."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio

from gantry.common.status import error_info_of
from gantry.controlplane.serving.kserve.service import SERVED, UNSERVED, KServeInference
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.fixtures.clients_env import clients_python  # noqa: F401  (fixture)
from tests.fixtures.vectors import assert_same_vectors
from tests.integration.harness import Harness, running_gantry
from tests.integration.kserve_support import bytes_tensor
from tests.integration.module_databases import MODULE_DATABASES, module_database

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
CLIENT_SCRIPT = Path(__file__).with_name("kserve_triton_client.py")
READY = cp.DEPLOYMENT_STATE_READY
CAPABILITY = "embed"
TEXTS = ["the gantry moves models", "a second sentence", "ünïcode survives"]

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's Gantry lives in its loop


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=MODULE_DATABASES)
async def gantry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> AsyncIterator[Harness]:
    """One Gantry per database with the tiny embedder READY as capability "embed"."""
    directory = tmp_path_factory.mktemp(f"kserve-{request.param}")
    root = directory / "artifacts"
    root.mkdir()
    async with (
        module_database(request.param, directory) as database_url,
        running_gantry(database_url, root) as harness,
    ):
        await harness.start_worker(await harness.register_node("kserve-node"))
        artifact = await harness.register_model(tiny_model_dir, "tiny-embedder")
        created = await harness.deploy(artifact.artifact_set_id, CAPABILITY)
        await harness.wait_deployment(created.deployment_id, READY, timeout=120)
        yield harness


def _kserve(harness: Harness) -> kserve_grpc.GRPCInferenceServiceStub:
    return kserve_grpc.GRPCInferenceServiceStub(harness.channel)


async def _embedded(harness: Harness, texts: list[str]) -> np.ndarray:
    response = await harness.inference.Embed(
        inf.EmbedRequest(capability=CAPABILITY, inputs=texts), metadata=harness.client_md
    )
    return np.array([list(vector.values) for vector in response.vectors], dtype=np.float32)


async def _refused(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    return caught.value.code(), info.reason, dict(info.metadata)


async def test_tritonclient_reads_health_metadata_and_the_embed_vectors(
    gantry: Harness,
    clients_python: str,  # noqa: F811
) -> None:
    child = await asyncio.create_subprocess_exec(
        clients_python,
        str(CLIENT_SCRIPT),
        gantry.address,
        gantry.api_key,
        CAPABILITY,
        *TEXTS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=120)
    assert child.returncode == 0, err.decode()
    document = json.loads(out)

    assert document["live"] is True and document["ready"] is True
    assert document["server"]["name"] == "gantry"
    assert document["model_ready"] is True and document["unknown_ready"] is False
    model = document["model"]
    assert model["name"] == CAPABILITY and model["platform"] == "gantry"
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert {"name": CAPABILITY, "state": "READY"} in document["index"]["models"]

    expected = await _embedded(gantry, TEXTS)
    # The width is stated: the probe that approved the deployment measured it.
    width = str(expected.shape[1])
    assert model["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", width]}]
    # Triton's ModelConfig, as far as Gantry can state it (max_batch_size 0: JSON leaves it out).
    assert document["config"]["config"] == {
        "name": CAPABILITY,
        "platform": "gantry",
        "backend": "gantry",
        "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": ["-1"]}],
        "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": ["-1", width]}],
    }
    for shaped in ("flat", "column"):
        answer = document[shaped]
        assert answer["datatype"] == "FP32" and answer["dtype"] == "float32"
        assert answer["shape"] == list(expected.shape)
        assert answer["id"] == "kserve-test" and answer["model_name"] == CAPABILITY
        got = np.array(answer["vectors"], dtype=np.float32)
        assert_same_vectors(got, expected)  # another call's: to float rounding
        raw = np.frombuffer(bytes.fromhex(answer["raw"]), dtype="<f4").reshape(expected.shape)
        np.testing.assert_array_equal(raw, got)  # one answer's two spellings: bit for bit

    assert document["wrong_key"]["status"] == "StatusCode.UNAUTHENTICATED"
    assert document["wrong_key_infer"]["status"] == "StatusCode.UNAUTHENTICATED"
    assert document["unknown_model"]["status"] == "StatusCode.NOT_FOUND"
    # Triton's statistics, parsed by the client (uint64 as JSON strings): at least this
    # script's two embeds, each a success with a duration.
    (stats,) = document["stats"]["model_stats"]
    assert stats["name"] == CAPABILITY and int(stats["inference_count"]) >= 2
    success = stats["inference_stats"]["success"]
    assert int(success["count"]) == int(stats["inference_count"]) and int(success["ns"]) > 0
    assert int(stats["last_inference"]) > 0
    unserved = document["not_served"]
    assert unserved["status"] == "StatusCode.UNIMPLEMENTED"
    assert unserved["message"].startswith("SystemSharedMemoryUnregister is not served")
    assert "ModelInfer" in unserved["message"]


async def test_typed_contents_in_and_out_equal_embed(gantry: Harness) -> None:
    """Without raw contents either way: BYTES in bytes_contents, FP32 back in fp32_contents."""
    request = kserve.ModelInferRequest(
        model_name=CAPABILITY,
        inputs=[
            kserve.ModelInferRequest.InferInputTensor(
                name="text",
                datatype="BYTES",
                shape=[len(TEXTS), 1],
                contents=kserve.InferTensorContents(bytes_contents=[t.encode() for t in TEXTS]),
            )
        ],
        parameters={"binary_data_output": kserve.InferParameter(bool_param=False)},
    )
    response = await _kserve(gantry).ModelInfer(request, metadata=gantry.client_md)
    expected = await _embedded(gantry, TEXTS)
    assert not response.raw_output_contents
    output = response.outputs[0]
    assert (output.name, output.datatype, list(output.shape)) == (
        "embedding",
        "FP32",
        list(expected.shape),
    )
    got = np.array(output.contents.fp32_contents, dtype=np.float32).reshape(expected.shape)
    assert_same_vectors(got, expected)
    assert response.parameters["deployment_id"].string_param


async def test_refusals_carry_gantry_reasons(gantry: Harness) -> None:
    stub = _kserve(gantry)

    def infer(name: str, datatype: str, values: list[bytes], **fields: Any) -> Any:
        return stub.ModelInfer(
            kserve.ModelInferRequest(
                model_name=fields.pop("model_name", CAPABILITY),
                inputs=[
                    kserve.ModelInferRequest.InferInputTensor(
                        name=name, datatype=datatype, shape=[len(values)]
                    )
                ],
                raw_input_contents=[bytes_tensor(values)],
            ),
            **fields,
        )

    md = gantry.client_md
    code, reason, _ = await _refused(infer("text", "BYTES", [b"x"], model_name="nope", metadata=md))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    code, reason, where = await _refused(infer("prompt", "BYTES", [b"x"], metadata=md))
    assert (code, reason, where["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "prompt",
    )
    code, reason, where = await _refused(infer("text", "FP32", [b"x"], metadata=md))
    assert (code, where["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "text")
    # An empty text is refused by Embed's own validation, reason and all.
    code, reason, _ = await _refused(infer("text", "BYTES", [b""], metadata=md))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_INPUT")
    code, reason, _ = await _refused(
        infer("text", "BYTES", [b"x"], metadata=(("authorization", "Bearer nope"),))
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # ModelInfer without a key is refused; ServerLive needs none.
    code, _, _ = await _refused(infer("text", "BYTES", [b"x"]))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert (await stub.ServerLive(kserve.ServerLiveRequest())).live


def _grpcurl(harness: Harness, *args: str, body: dict[str, Any] | None = None) -> str:
    completed = subprocess.run(
        [
            str(GRPCURL),
            "-plaintext",
            "-H",
            f"authorization: Bearer {harness.api_key}",
            *(["-d", "@"] if body is not None else []),
            harness.address,
            *args,
        ],
        input=json.dumps(body) if body is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


async def test_grpcurl_lists_and_infers_through_reflection(gantry: Harness) -> None:
    listed = await asyncio.to_thread(_grpcurl, gantry, "list", "inference.GRPCInferenceService")
    for method in ("ServerLive", "ServerReady", "ModelReady", "ModelMetadata", "ModelInfer"):
        assert f"inference.GRPCInferenceService.{method}" in listed.split()
    body = {
        "model_name": CAPABILITY,
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [2],
                "contents": {
                    "bytes_contents": [base64.b64encode(t.encode()).decode() for t in TEXTS[:2]]
                },
            }
        ],
        "parameters": {"binary_data_output": {"bool_param": False}},
    }
    out = await asyncio.to_thread(
        _grpcurl, gantry, "inference.GRPCInferenceService/ModelInfer", body=body
    )
    answer = json.loads(out)
    contents = answer["outputs"][0]["contents"]
    got = np.array(contents.get("fp32_contents", contents.get("fp32Contents")), dtype=np.float32)
    expected = await _embedded(gantry, TEXTS[:2])
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-6)


async def test_every_rpc_is_served_or_refused_with_error_info(gantry: Harness) -> None:
    """Each RPC of the service's descriptor is answered here: a served one by the servicer's own
    method, any other UNIMPLEMENTED with the reason UNIMPLEMENTED and the served list, never
    gRPC's bare UNIMPLEMENTED (a method left to the generated base class)."""
    methods = kserve.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert {method.name for method in methods} == set(SERVED) | set(UNSERVED)
    base = kserve_grpc.GRPCInferenceServiceServicer
    for method in methods:
        if method.name in SERVED:
            assert getattr(KServeInference, method.name) is not getattr(base, method.name)
            continue
        call = gantry.channel.unary_unary(
            f"/inference.GRPCInferenceService/{method.name}",
            request_serializer=bytes,
            response_deserializer=bytes,
        )
        code, reason, metadata = await _refused(call(b"", metadata=gantry.client_md))
        assert (code, reason) == (grpc.StatusCode.UNIMPLEMENTED, "UNIMPLEMENTED"), method.name
        assert (metadata["method"], metadata["served"]) == (method.name, ",".join(SERVED))


async def test_model_statistics_tally_each_call_of_the_capability_whatever_its_door(
    gantry: Harness,
) -> None:
    stub = _kserve(gantry)
    md = gantry.client_md

    async def stats() -> kserve.ModelStatistics:
        answer = await stub.ModelStatistics(
            kserve.ModelStatisticsRequest(name=CAPABILITY), metadata=md
        )
        (one,) = answer.model_stats
        return one

    before = await stats()
    await _embedded(gantry, TEXTS)  # gantry.v1
    await stub.ModelInfer(
        kserve.ModelInferRequest(
            model_name=CAPABILITY,
            inputs=[
                kserve.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])
            ],
            raw_input_contents=[bytes_tensor([b"one more"])],
        ),
        metadata=md,
    )
    # Past the model's token limit: refused by its host, after the capability resolved.
    overlong = inf.EmbedRequest(capability=CAPABILITY, inputs=["hello world " * 100])
    _, reason, _ = await _refused(gantry.inference.Embed(overlong, metadata=md))
    assert reason == "INPUT_TOO_LONG"
    after = await stats()

    assert after.name == CAPABILITY
    assert after.inference_count - before.inference_count == 2
    assert after.execution_count == after.inference_count
    success, fail = after.inference_stats.success, after.inference_stats.fail
    assert success.count - before.inference_stats.success.count == 2
    assert success.ns > before.inference_stats.success.ns
    assert fail.count - before.inference_stats.fail.count == 1
    assert fail.ns > before.inference_stats.fail.ns
    assert after.last_inference > 0 and after.last_inference >= before.last_inference

    every = await stub.ModelStatistics(kserve.ModelStatisticsRequest(), metadata=md)
    assert [one.name for one in every.model_stats] == [CAPABILITY]
    code, reason, _ = await _refused(
        stub.ModelStatistics(kserve.ModelStatisticsRequest(name="no-such"), metadata=md)
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
