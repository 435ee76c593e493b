"""`gantry deploy/unload/restart/scale/delete deployment` against the real in-process control
plane (SQLite and PostgreSQL) with scripted workers: `--wait` follows the deployment until it
settles and says each change on stderr; a failed load exits 1 with its reason and message; a
refused delete prints its reason once and exits 1; `deployments` hides deleted ones unless --all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of
from tests.integration.test_deployment_lifecycle import fail_loads


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


@pytest.fixture
def state_dir(gantry: Pipeline, tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "operator.token").write_text(gantry.harness.operator_token + "\n")
    return state


async def cli(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, str, str]:
    argv = ["--address", gantry.harness.address, "--state-dir", str(state_dir), *arguments]
    capsys.readouterr()
    # The CLI is synchronous; the servers and scripted workers share this loop: run it aside.
    status = await asyncio.to_thread(gantry_cli, argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def deployment_id_of(out: str) -> str:
    first = out.splitlines()[0]  # `deployment ID (capability, ...): STATE`
    assert first.startswith("deployment "), out
    return first.split()[1]


async def test_deploy_waits_until_ready_then_unload_restart_scale_and_delete(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("left", "right"):
        await gantry.worker(name)
    approval = await gantry.approved()

    status, out, err = await cli(
        gantry, state_dir, capsys, "deploy", approval.approval_id, "--capability", "minilm"
    )
    assert status == 0, err
    deployment_id = deployment_id_of(out)
    assert out.splitlines()[-1] == f"deployment {deployment_id} (minilm): READY, 1/1 resident"
    assert f"deployment {deployment_id} READY: 1/1 resident" in err  # progress, on stderr
    assert (await gantry.harness.deployment(deployment_id)).state == cp.DEPLOYMENT_STATE_READY

    status, out, err = await cli(gantry, state_dir, capsys, "delete", "deployment", deployment_id)
    assert status == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("error: FAILED_PRECONDITION DEPLOYMENT_IN_USE: ")
    assert line.count("DEPLOYMENT_IN_USE") == 1
    assert f"gantry unload {deployment_id}" in line

    status, out, err = await cli(
        gantry, state_dir, capsys, "scale", deployment_id, "--replicas", "2"
    )
    assert status == 0, err
    assert out.strip() == f"deployment {deployment_id} (minilm): READY, 2/2 resident"

    status, out, err = await cli(gantry, state_dir, capsys, "restart", deployment_id, "-o", "json")
    assert status == 0, err
    assert '"state": "DEPLOYMENT_STATE_READY"' in out
    assert f"deployment {deployment_id} restarted" in err

    status, out, err = await cli(gantry, state_dir, capsys, "unload", deployment_id)
    assert status == 0, err
    assert out.strip() == f"deployment {deployment_id}: UNLOADED"
    assert "still loaded" in err

    status, out, err = await cli(gantry, state_dir, capsys, "delete", "deployment", deployment_id)
    assert status == 0, err
    assert out.strip() == f"deployment {deployment_id} (minilm): UNLOADED, deleted, 0/2 resident"

    status, out, _ = await cli(gantry, state_dir, capsys, "deployments")
    assert status == 0 and deployment_id not in out
    status, out, _ = await cli(gantry, state_dir, capsys, "deployments", "--all")
    assert status == 0
    [row] = [line for line in out.splitlines() if line.startswith(deployment_id)]
    assert row.split()[2] == "UNLOADED/deleted"


async def test_deploy_wait_exits_1_with_the_failure_reason_and_message(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = await gantry.worker("left")
    approval = await gantry.approved()
    fail_loads(worker)
    status, out, err = await cli(
        gantry, state_dir, capsys, "deploy", approval.approval_id, "--capability", "minilm"
    )
    assert status == 1
    deployment_id = deployment_id_of(out)
    assert err.splitlines()[-1] == (
        f"error: deployment {deployment_id} will not be READY:"
        " RUNTIME_INCOMPATIBLE: the adapter is not installed here"
    )
    assert "Traceback" not in err


async def test_no_wait_returns_at_once_and_a_timeout_says_what_it_waited_for(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = await gantry.worker("left")
    approval = await gantry.approved()
    worker.drop_next_assignments = 1  # the LOAD is lost: it stays LOADING until its lease ends
    status, out, err = await cli(
        gantry,
        state_dir,
        capsys,
        "deploy",
        approval.approval_id,
        "--capability",
        "minilm",
        "--wait-timeout",
        "1",
    )
    assert status == 1
    deployment_id = deployment_id_of(out)
    assert err.splitlines()[-1] == (
        f"error: deployment {deployment_id} is still LOADING after 1s; waiting for READY with 1"
        " RESIDENT replica(s) (0 so far)"
    )

    worker.drop_next_assignments = 1  # the UNLOAD is lost too: it stays UNLOADING
    status, out, err = await cli(gantry, state_dir, capsys, "unload", deployment_id, "--no-wait")
    assert status == 0, err
    assert out.strip() == f"deployment {deployment_id}: UNLOADING"
    assert err == ""
