"""The Open Inference Protocol over REST on the control plane's HTTP port, driven by the real
tritonclient.http (from the clients environment, in a child process) and by raw HTTP, against an
in-process Gantry (SQLite) serving the tiny sentence embedder, the tiny cross-encoder and the tiny
causal LM: the vectors are gantry.v1 Embed's, the scores gantry.v1 Rerank's, and a refusal
carries Gantry's reason in KServe's error shape. And tritonclient.grpc's decoupled streaming
(ModelStreamInfer) on the gRPC port: its chunks join to gantry.v1 Generate's greedy text."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio

from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.fixtures.clients_env import clients_python  # noqa: F401  (fixture)
from tests.fixtures.vectors import assert_same_vectors
from tests.integration.harness import Harness, running_gantry
from tests.integration.kserve_support import infer_rest
from tests.integration.test_openai_http_door_bounds import _read_to_end as read_to_end

CLIENT_SCRIPT = Path(__file__).with_name("kserve_triton_http_client.py")
STREAM_SCRIPT = Path(__file__).with_name("kserve_triton_stream_client.py")
READY = cp.DEPLOYMENT_STATE_READY
CAPABILITY, RERANKER, GENERATOR = "embed", "rerank", "tiny-lm"
MAX_TOKENS = 24
QUERY = "the quick brown fox"
TEXTS = ["the gantry moves models", "a second sentence", "ünïcode survives"]
HANG_GUARD_S = 60.0

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's Gantry lives in its loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gantry(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    tiny_cross_encoder_dir: Path,
    tiny_causal_lm_dir: Path,
) -> AsyncIterator[Harness]:
    directory = tmp_path_factory.mktemp("kserve-rest")
    root = directory / "artifacts"
    root.mkdir()
    database_url = f"sqlite+aiosqlite:///{directory / 'g.db'}"
    async with running_gantry(database_url, root, http_listen="127.0.0.1:0") as harness:
        await harness.start_worker(await harness.register_node("rest-node"))
        lm = {"device": "cpu", "max_new_tokens": 48}
        for model, capability, adapter, settings in (
            (tiny_model_dir, CAPABILITY, "", {}),
            (tiny_cross_encoder_dir, RERANKER, "sentence_transformers_cross_encoder", {}),
            (tiny_causal_lm_dir, GENERATOR, "transformers_causal_lm", lm),
        ):
            artifact = await harness.register_model(model, capability)
            created = await harness.deploy(
                artifact.artifact_set_id, capability, adapter=adapter, **settings
            )
            await harness.wait_deployment(created.deployment_id, READY, timeout=180)
        yield harness


def _address(harness: Harness) -> str:
    assert harness.control_plane.http_api is not None
    return f"127.0.0.1:{harness.control_plane.http_api.port}"


async def _embedded(harness: Harness) -> np.ndarray:
    response = await harness.inference.Embed(
        inf.EmbedRequest(capability=CAPABILITY, inputs=TEXTS), metadata=harness.client_md
    )
    return np.array([list(vector.values) for vector in response.vectors], dtype=np.float32)


async def test_tritonclient_http_works_unchanged(
    gantry: Harness,
    clients_python: str,  # noqa: F811
) -> None:
    child = await asyncio.create_subprocess_exec(
        clients_python,
        str(CLIENT_SCRIPT),
        _address(gantry),
        gantry.api_key,
        CAPABILITY,
        RERANKER,
        QUERY,
        *TEXTS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=HANG_GUARD_S)
    assert child.returncode == 0, err.decode()
    answer = json.loads(out)

    assert answer["live"] is True and answer["ready"] is True
    assert answer["server"]["name"] == "gantry" and "parameters" in answer["server"]["extensions"]
    assert answer["model_ready"] is True and answer["unknown_ready"] is False
    assert answer["model"]["platform"] == "gantry"
    assert answer["model"]["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert answer["versioned"] == answer["model"]
    assert answer["config"]["backend"] == "gantry"
    assert answer["config"]["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert {model["name"]: model["state"] for model in answer["index"]} == {
        CAPABILITY: "READY",
        RERANKER: "READY",
        GENERATOR: "READY",
    }

    expected = await _embedded(gantry)
    # The embedding's width as the deployment's probe measured it, in metadata and config.
    width = expected.shape[1]
    assert answer["model"]["outputs"] == [
        {"name": "embedding", "datatype": "FP32", "shape": [-1, width]}
    ]
    assert answer["config"]["output"] == [
        {"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, width]}
    ]
    for spelling in ("binary", "json"):
        got = answer[spelling]
        assert got["dtype"] == "float32" and got["id"] == "rest-test"
        assert got["output"]["shape"] == list(expected.shape)
        assert got["model_name"] == CAPABILITY and set(got["parameters"]) == {
            "deployment_id",
            "node_id",
        }
        # The binary output is the worker's block, the JSON one reads back to it; against
        # another call's vectors, to float rounding (tests/fixtures/vectors.py).
        assert_same_vectors(np.array(got["vectors"], dtype=np.float32), expected)
    assert "binary_data_size" in answer["binary"]["output"]["parameters"]

    ranked = await gantry.inference.Rerank(
        inf.RerankRequest(capability=RERANKER, query=QUERY, documents=TEXTS),
        metadata=gantry.client_md,
    )
    scores = np.zeros(len(TEXTS), dtype=np.float32)
    for result in ranked.results:
        scores[result.index] = result.score
    assert answer["rerank"]["dtype"] == "float32"
    np.testing.assert_array_equal(np.array(answer["rerank"]["scores"], dtype=np.float32), scores)

    assert answer["wrong_key"]["status"] == "401"
    assert answer["wrong_key_infer"]["status"] == "401"
    assert answer["unknown_model"]["status"] == "404"
    assert answer["bad_tensor"]["status"] == "400" and "'txt'" in answer["bad_tensor"]["message"]
    assert answer["not_served"]["status"] == "501"
    assert answer["not_served"]["message"].startswith("RepositoryModelLoad is not served")
    # Triton's statistics as tritonclient.http reads them: at least the script's successes.
    (stats,) = answer["stats"]["model_stats"]
    assert stats["name"] == CAPABILITY and stats["inference_count"] >= 2
    assert stats["inference_stats"]["success"]["count"] == stats["inference_count"]
    assert stats["inference_stats"]["success"]["ns"] > 0 and stats["last_inference"] > 0
    assert {one["name"] for one in answer["all_stats"]["model_stats"]} == {
        CAPABILITY,
        RERANKER,
        GENERATOR,
    }


async def test_refusals_are_kserve_shaped_with_gantry_reason(gantry: Harness) -> None:
    headers = {"authorization": f"Bearer {gantry.api_key}"}
    async with httpx.AsyncClient(base_url=f"http://{_address(gantry)}") as http:
        # Open: probes carry no key.
        assert (await http.get("/v2/health/live")).status_code == 200
        assert (await http.get("/v2")).json()["name"] == "gantry"
        refused = await http.get(f"/v2/models/{CAPABILITY}")
        assert refused.status_code == 401
        assert refused.json()["code"] == "UNAUTHENTICATED" and refused.json()["error"]
        assert refused.headers["x-gantry-reason"] == "UNAUTHENTICATED"

        missing = await http.get("/v2/models/no-such", headers=headers)
        assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"

        bad = await http.post(
            f"/v2/models/{CAPABILITY}/infer",
            headers=headers,
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]},
        )
        assert bad.status_code == 400
        assert bad.json()["code"] == "INVALID_ARGUMENT" and bad.json()["param"] == "text"

        # A JSON request answered in JSON; raw HTTP reads the same vector the gRPC door gives.
        answer = await http.post(
            f"/v2/models/{CAPABILITY}/infer",
            headers=headers,
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS}]},
        )
        assert answer.status_code == 200 and "inference-header-content-length" not in answer.headers
        (output,) = answer.json()["outputs"]
        got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
        assert_same_vectors(got, await _embedded(gantry))


async def test_a_body_past_the_bound_is_refused_before_it_is_read(gantry: Harness) -> None:
    """413 on the Content-Length alone: the client sends headers only and still hears it."""
    assert gantry.control_plane.http_api is not None
    port = gantry.control_plane.http_api.port
    head = (
        f"POST /v2/models/{CAPABILITY}/infer HTTP/1.1\r\nhost: gantry\r\nconnection: close\r\n"
        f"authorization: Bearer {gantry.api_key}\r\ncontent-type: application/octet-stream\r\n"
        f"inference-header-content-length: 2\r\ncontent-length: {2**40}\r\n\r\n"
    ).encode()

    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(head)
        answer = await read_to_end(sock)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"413", answer[:200]
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["code"] == "INVALID_ARGUMENT" and str(2**40) in body["error"]


async def test_binary_tensors_in_and_out_over_raw_http(gantry: Harness) -> None:
    """The binary extension as Triton's other clients send it (kserve_support.infer_rest): the
    JSON part's length in the header, each input's bytes after it; the outputs' bytes after the
    answer's JSON part."""
    got = await infer_rest(gantry, CAPABILITY, {"text": [text.encode() for text in TEXTS]})
    assert_same_vectors(got["embedding"], await _embedded(gantry))


async def test_model_stream_infer_streams_a_generation_as_triton_decoupled_responses(
    gantry: Harness,
    clients_python: str,  # noqa: F811
) -> None:
    prompt = "The weather"
    child = await asyncio.create_subprocess_exec(
        clients_python,
        str(STREAM_SCRIPT),
        gantry.address,
        gantry.api_key,
        GENERATOR,
        prompt,
        str(MAX_TOKENS),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=HANG_GUARD_S)
    assert child.returncode == 0, err.decode()
    answer = json.loads(out)
    whole = await gantry.inference.Generate(
        inf.GenerateRequest(capability=GENERATOR, prompt=prompt, max_tokens=MAX_TOKENS),
        metadata=gantry.client_md,
    )
    # Greedy: the streamed chunks join to the text Generate answers, in more than one response.
    assert "".join(answer["chunks"]) == whole.text and len(answer["chunks"]) > 1
    assert answer["finish"] in ("stop", "length") and answer["id"] == "streamed"
    assert answer["parameters"]["deployment_id"] == whole.deployment_id
    # A refused request is answered on the stream, with its reason, and the stream goes on.
    assert answer["refused"].startswith("INVALID_ARGUMENT: ") and "'prompt'" in answer["refused"]


async def test_statistics_and_unserved_paths_over_raw_http(gantry: Harness) -> None:
    headers = {"authorization": f"Bearer {gantry.api_key}"}
    async with httpx.AsyncClient(base_url=f"http://{_address(gantry)}") as http:

        async def reranker_stats() -> dict:
            answer = await http.get(f"/v2/models/{RERANKER}/versions/1/stats", headers=headers)
            assert answer.status_code == 200, answer.text
            (one,) = answer.json()["model_stats"]
            return one

        before = await reranker_stats()
        await gantry.inference.Rerank(
            inf.RerankRequest(capability=RERANKER, query=QUERY, documents=TEXTS),
            metadata=gantry.client_md,
        )
        after = await reranker_stats()
        assert after["name"] == RERANKER
        assert after["inference_count"] - before["inference_count"] == 1
        assert after["inference_stats"]["fail"] == before["inference_stats"]["fail"]
        assert after["last_inference"] >= before["last_inference"]

        missing = await http.get("/v2/models/no-such/stats", headers=headers)
        assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
        refused = await http.get("/v2/models/stats")
        assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHENTICATED"

        # Triton's paths for what Gantry does not serve: 501, the reason and the served list.
        for method, path in (
            ("POST", "/v2/systemsharedmemory/region/r0/register"),
            ("GET", "/v2/cudasharedmemory/status"),
            ("POST", f"/v2/models/{CAPABILITY}/trace/setting"),
            ("GET", "/v2/logging"),
        ):
            unserved = await http.request(method, path, headers=headers, json={})
            assert unserved.status_code == 501, (path, unserved.text)
            body = unserved.json()
            assert body["code"] == "UNIMPLEMENTED" and "ModelInfer" in body["served"]
            assert unserved.headers["x-gantry-reason"] == "UNIMPLEMENTED"
