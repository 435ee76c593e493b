"""A runtime environment mapped but not built (`make run` maps "vision" and "llama" before either
is built): the real worker reports it unavailable with the command that builds it, and asking for
it is refused at once, naming that command, before any job is sent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from gantry.controlplane.jobs import store as jobs
from gantry.v1 import control_plane_pb2 as cp
from gantry.worker.model_host.environments import DEFAULT_EXECUTABLE, ENV_MAP_FILE, ENV_MAP_JSON
from tests.integration.harness import running_gantry


async def test_an_environment_that_is_not_built_is_refused_at_once_naming_its_build_command(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    missing = tmp_path / ".venv-vision" / "bin" / "python"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (ENV_MAP_JSON, ENV_MAP_FILE, DEFAULT_EXECUTABLE)
    }
    env[ENV_MAP_JSON] = json.dumps({"vision": {"python": str(missing), "build": "make vision-env"}})
    async with running_gantry(database_url, root) as harness:
        agent = await harness.start_worker(await harness.register_node("cpu"), env=env)
        inventory = await harness.operator.GetInventory(
            cp.GetInventoryRequest(node_id=agent.node_id), metadata=harness.op_md
        )
        vision = {e.environment_id: e for e in inventory.environments}["vision"]
        assert not vision.available
        assert vision.unavailable_reason.endswith("not built here; `make vision-env` builds it")
        artifact = await harness.register_model(tiny_model_dir, "tiny")

        for node_id in ("", agent.node_id):  # any node, and this node by name
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await harness.operator.AssessCompatibility(
                    cp.AssessCompatibilityRequest(
                        artifact_set_id=artifact.artifact_set_id,
                        environment_id="vision",
                        node_id=node_id,
                    ),
                    metadata=harness.op_md,
                )
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = caught.value.details() or ""
            assert details.startswith(
                "runtime environment 'vision' is unavailable on every node that could run this: "
                f"node {agent.node_id}: python executable '{missing}'"
            )
            assert "`make vision-env` builds it" in details
        async with harness.control_plane.database.transaction() as session:
            assert list(await jobs.list_jobs(session, after="", limit=10)) == []  # none sent
