"""`gantry nodes`, `gantry keys` and `gantry artifacts list|delete` through `gantry.cli.main`
against the real in-process control plane (SQLite and PostgreSQL): a registered node's printed
credential connects a worker, a drain waits (and fails with the reason on its timeout), deletes
are refused while in use with the reason, a created key works until revoked, and every
`--output json` parses back."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import wait_for
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of
from tests.integration.scripted_worker import ScriptedWorker
from tests.integration.test_registry_deletes import holding_unloads


@dataclass
class Cli:
    gantry: Pipeline
    state_dir: Path
    capsys: pytest.CaptureFixture[str]

    async def run(self, *arguments: str) -> tuple[int, str, str]:
        argv = [
            "--address",
            self.gantry.harness.address,
            "--state-dir",
            str(self.state_dir),
            *arguments,
        ]
        self.capsys.readouterr()
        # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
        status = await asyncio.to_thread(gantry_cli, argv)
        captured = self.capsys.readouterr()
        return status, captured.out, captured.err

    async def json(self, *arguments: str) -> Any:
        status, out, err = await self.run(*arguments, "--output", "json")
        assert status == 0, err
        return json.loads(out)


@pytest.fixture
async def cli(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> AsyncIterator[Cli]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        (state_dir / "operator.token").write_text(pipeline.harness.operator_token + "\n")
        yield Cli(gantry=pipeline, state_dir=state_dir, capsys=capsys)


async def connects(cli: Cli, credential: str) -> ScriptedWorker:
    worker = ScriptedWorker()
    await worker.start(cli.gantry.harness.channel, credential)  # waits for its Welcome
    cli.gantry.workers.append(worker)
    return worker


async def test_a_registered_nodes_credential_connects_its_worker_and_a_drained_node_is_deleted(
    cli: Cli,
) -> None:
    registered = await cli.json("nodes", "register", "edge-1", "--label", "zone=a")
    assert registered["node"]["name"] == "edge-1"
    assert registered["node"]["labels"] == {"zone": "a"}
    worker = await connects(cli, registered["credential"])
    node_id = registered["node"]["node_id"]

    status, out, err = await cli.run("nodes", "register", "edge-2")
    assert status == 0, err
    printed = dict(line.split(None, 1) for line in out.splitlines())
    assert printed["name"] == "edge-2"
    assert "shown only once" in err and "--credential-file" in err
    await connects(cli, printed["credential"])

    credential_file = cli.state_dir / "edge-3.credential"
    status, out, err = await cli.run(
        "nodes", "register", "edge-3", "--credential-file", str(credential_file)
    )
    assert status == 0, err
    assert "gnc_" not in out and str(credential_file) in err
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    await connects(cli, credential_file.read_text().strip())
    status, _, err = await cli.run(
        "nodes", "register", "edge-4", "--credential-file", str(credential_file)
    )
    assert status == 1 and "exists" in err  # refused before registering: no edge-4
    listed = await cli.json("nodes")
    assert sorted(n["name"] for n in listed) == ["edge-1", "edge-2", "edge-3"]
    assert {n["state"] for n in listed} == {"NODE_STATE_CONNECTED"}

    # `gantry delete node` is the same command as `gantry nodes delete`.
    status, out, err = await cli.run("delete", "node", "edge-1")
    assert (status, out) == (1, "")
    assert "NODE_IN_USE" in err and "gantry nodes drain" in err
    assert err.count("\n") == 1  # one line, no traceback

    status, out, err = await cli.run("nodes", "drain", "edge-1", "--reason", "retiring")
    assert status == 0, err
    assert "drained" in out
    await worker.stop()
    deleted = await cli.json("nodes", "delete", "edge-1")
    assert deleted["node_id"] == node_id and "deleted_at" in deleted
    assert sorted(n["name"] for n in await cli.json("nodes")) == ["edge-2", "edge-3"]
    everything = await cli.json("nodes", "list", "--all")
    assert {n["name"]: "deleted_at" in n for n in everything} == {
        "edge-1": True,
        "edge-2": False,
        "edge-3": False,
    }
    status, out, _ = await cli.run("nodes", "--all")
    assert status == 0 and "DELETED (DISABLED)" in out

    refused = ScriptedWorker()
    await refused.start(cli.gantry.harness.channel, registered["credential"], wait=False)
    await asyncio.wait_for(refused.ended.wait(), 10)
    assert refused.end_error is not None
    assert refused.end_error.code() == grpc.StatusCode.UNAUTHENTICATED
    again = await cli.json("nodes", "register", "edge-1")
    assert again["node"]["node_id"] != node_id


async def test_a_drain_waits_for_its_unloads_and_fails_with_the_reason_on_its_timeout(
    cli: Cli,
) -> None:
    worker = await cli.gantry.worker("left")
    held: list[wg.JobAssignment] = []
    holding_unloads(worker, held)
    approval = await cli.gantry.approved()
    deployment = await cli.gantry.deploy(approval.approval_id, "minilm")
    await cli.gantry.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)

    # The node's replica drains first (its calls finish); its UNLOAD follows once it is idle.
    status, out, err = await cli.run("nodes", "drain", "left", "--wait-timeout", "0.1")
    assert status == 1 and "not drained after 0.1s" in err
    await wait_for(lambda: bool(held), what="the UNLOAD after the drain")
    status, out, err = await cli.run("nodes", "drain", "left", "--wait-timeout", "1")
    assert (status, out) == (1, "")
    last = err.splitlines()[-1]
    assert last.startswith("error: node ") and "not drained after 1s" in last
    assert f"{deployment.deployment_id} UNLOADING" in last
    assert "waiting for 1 residency(ies)" in err  # progress said while it waited

    assert held, "the drain sent no UNLOAD"
    result = worker.default_answer(held[0])
    assert result is not None
    worker.send(wg.WorkerMessage(job_result=result))
    status, out, err = await cli.run("nodes", "drain", "left")  # already disabled: waits only
    assert status == 0, err
    current = await cli.gantry.harness.deployment(deployment.deployment_id)
    assert [r.state for r in current.residencies] == [common_pb2.RESIDENCY_STATE_COLD]


async def test_a_created_key_works_until_it_is_revoked(cli: Cli) -> None:
    created = await cli.json("keys", "create", "--tenant", "team-a", "--name", "ci")
    assert created["tenant_id"] == "team-a" and created["api_key"].startswith("gak_")
    request = inf.EmbedRequest(capability="nothing-deployed", inputs=["x"])
    embed = cli.gantry.harness.inference.Embed

    async def embed_reason() -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await embed(request, metadata=auth_metadata(created["api_key"]), timeout=10)
        info = error_info_of(caught.value)
        return caught.value.code(), info.reason if info else ""

    # Authenticated: the capability is what is unknown.
    assert await embed_reason() == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    listed = await cli.json("keys", "list", "--tenant", "team-a")
    assert [(k["api_key_id"], k["name"]) for k in listed] == [(created["api_key_id"], "ci")]
    assert created["api_key"] not in json.dumps(listed)
    status, out, err = await cli.run("keys")
    assert status == 0 and created["api_key_id"] in out

    status, out, err = await cli.run("keys", "revoke", created["api_key_id"])
    assert status == 0, err
    assert created["api_key_id"] in out and "revoked" in out
    assert await embed_reason() == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    revoked = await cli.json("keys", "list", "--tenant", "team-a")
    assert "revoked_at" in revoked[0]

    status, out, err = await cli.run("keys", "create", "--tenant", "team-a")
    assert status == 0, err
    assert "shown only once" in err
    plain = dict(line.split(None, 1) for line in out.splitlines())["api_key"]
    assert plain.startswith("gak_")


async def test_artifacts_list_and_delete_from_the_cli(cli: Cli) -> None:
    artifact = await cli.gantry.artifact()
    listed = await cli.json("artifacts", "list")
    assert [a["artifact_set_id"] for a in listed] == [artifact.artifact_set_id]
    status, out, err = await cli.run("delete", "artifacts", artifact.artifact_set_id)
    assert status == 0, err
    assert "were not touched" in out
    assert await cli.json("artifacts", "list") == []
    everything = await cli.json("artifacts", "list", "--all")
    assert [a["artifact_set_id"] for a in everything] == [artifact.artifact_set_id]
    assert "deleted_at" in everything[0]
    status, out, err = await cli.run("artifacts", "delete", "not-an-id")
    assert (status, out) == (1, "")
    assert err.startswith("error: INVALID_ARGUMENT")
