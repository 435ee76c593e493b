"""`gantry drain DEPLOYMENT_ID [--deadline S]` against the real in-process control plane (SQLite
and PostgreSQL) with a scripted worker: `--wait` (the default) follows the deployment until it is
UNLOADED; a deadline past the server's bound is refused with its reason, one past the CLI's
type a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.cli.main import build_parser
from gantry.controlplane.deployments.drain_rules import MAX_DRAIN_DEADLINE_S
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.pipeline_support import Pipeline
from tests.integration.test_cli_deployments import (  # noqa: F401 (fixtures)
    cli,
    deployment_id_of,
    gantry,
    state_dir,
)


async def test_drain_waits_until_unloaded_and_refuses_a_deadline_past_its_bound(
    gantry: Pipeline,  # noqa: F811
    state_dir: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    await gantry.worker("left")
    approval = await gantry.approved()
    status, out, err = await cli(
        gantry, state_dir, capsys, "deploy", approval.approval_id, "--capability", "minilm"
    )
    assert status == 0, err
    deployment_id = deployment_id_of(out)

    status, out, err = await cli(
        gantry,
        state_dir,
        capsys,
        "drain",
        deployment_id,
        "--deadline",
        str(MAX_DRAIN_DEADLINE_S + 1),
    )
    assert status == 1 and out == ""
    assert err.splitlines() == [
        f"error: INVALID_ARGUMENT: deadline_seconds is {MAX_DRAIN_DEADLINE_S + 1};"
        f" a drain waits at most {MAX_DRAIN_DEADLINE_S}s"
    ]
    assert (await gantry.harness.deployment(deployment_id)).state == cp.DEPLOYMENT_STATE_READY

    with pytest.raises(SystemExit) as usage:  # a deadline is above 0: a usage error
        build_parser().parse_args(["drain", deployment_id, "--deadline", "0"])
    assert usage.value.code == 2

    status, out, err = await cli(
        gantry, state_dir, capsys, "drain", deployment_id, "--deadline", "5"
    )
    assert status == 0, err
    assert out.strip() == f"deployment {deployment_id} (minilm): UNLOADED, 0/1 resident"
    assert f"deployment {deployment_id} draining: UNLOADING" in err
    assert "DRAINING" in err  # the wait said the residency drains before it unloads
