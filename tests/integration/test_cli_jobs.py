"""`gantry jobs` against the real in-process control plane on SQLite and PostgreSQL: jobs put in
its database are listed oldest first, filtered by node (id or name), state and type, limited to
the newest, shown one at a time with their failure, and as JSON; bad input is one line, exit 1."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common import tokens
from gantry.common.ids import new_id
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.platform.state_machines import JobState, JobType
from tests.integration.harness import Harness, running_gantry

T0 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)


@dataclass
class Fleet:
    harness: Harness
    state_dir: Path
    alpha: str  # node ids
    beta: str
    queued: str  # job ids, oldest first
    failed: str
    probe: str
    probe_id: str


async def add_job(
    harness: Harness,
    *,
    job_type: JobType,
    node_id: str,
    created_at: dt.datetime,
    state: JobState = JobState.QUEUED,
    failure: tuple[str, str] = ("", ""),
    **subject: str,
) -> str:
    """A job row as the lifecycle leaves it, written straight to the control plane's database."""
    async with harness.control_plane.database.transaction() as session:
        row = await jobs.create_job(
            session, job_type=job_type, node_id=node_id, now=created_at, **subject
        )
        row.state = state
        row.failure_reason, row.failure_message = failure
        row.attempt_count = 0 if state == JobState.QUEUED else 1
        row.updated_at = created_at + dt.timedelta(seconds=30)
        await session.flush()
        return row.job_id


@pytest.fixture
async def fleet(database_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    root = tmp_path / "artifacts"
    root.mkdir()
    # No reconciler: nothing may lease, fail or cancel the jobs this test puts in place.
    async with running_gantry(database_url, root, run_reconciler=False) as harness:
        alpha = tokens.parse_token(
            await harness.register_node("alpha"), kind=tokens.NODE_CREDENTIAL
        )
        beta = tokens.parse_token(await harness.register_node("beta"), kind=tokens.NODE_CREDENTIAL)
        assert alpha is not None and beta is not None
        probe_id = new_id()
        # Inserted newest first: the listing orders by creation time, not by (random) id.
        probe = await add_job(
            harness,
            job_type=JobType.PROBE,
            node_id=beta.token_id,
            created_at=T0 + dt.timedelta(minutes=2),
            state=JobState.SUCCEEDED,
            probe_id=probe_id,
        )
        failed = await add_job(
            harness,
            job_type=JobType.INSPECT,
            node_id=alpha.token_id,
            created_at=T0 + dt.timedelta(minutes=1),
            state=JobState.FAILED,
            failure=("RUNTIME_INCOMPATIBLE", "no inspector\nknows this format"),
            assessment_id=new_id(),
        )
        queued = await add_job(
            harness,
            job_type=JobType.INSPECT,
            node_id=alpha.token_id,
            created_at=T0,
            assessment_id=new_id(),
        )
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        (state_dir / "operator.token").write_text(harness.operator_token + "\n")
        yield Fleet(
            harness=harness,
            state_dir=state_dir,
            alpha=alpha.token_id,
            beta=beta.token_id,
            queued=queued,
            failed=failed,
            probe=probe,
            probe_id=probe_id,
        )


async def gantry(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, str, str]:
    argv = ["--address", fleet.harness.address, "--state-dir", str(fleet.state_dir), *arguments]
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def ids_listed(table: str) -> list[str]:
    header, *rows = table.splitlines()
    assert header.split()[:3] == ["ID", "TYPE", "STATE"]
    return [row.split()[0] for row in rows]


async def test_jobs_lists_every_job_oldest_first_with_its_outcome(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = await gantry(fleet, capsys, "jobs")
    assert (status, err) == (0, "")
    assert ids_listed(out) == [fleet.queued, fleet.failed, fleet.probe]
    rows = {row.split()[0]: row for row in out.splitlines()[1:]}
    assert rows[fleet.queued].split()[1:4] == ["INSPECT", "QUEUED", fleet.alpha]
    assert rows[fleet.failed].split()[1:4] == ["INSPECT", "FAILED", fleet.alpha]
    assert rows[fleet.failed].endswith("RUNTIME_INCOMPATIBLE: no inspector knows this format")
    assert f"probe {fleet.probe_id}" in rows[fleet.probe]


async def test_filters_by_node_name_or_id_state_and_type_and_limits_to_the_newest(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = await gantry(fleet, capsys, "jobs", "--node", "alpha", "--state", "FAILED")
    assert ids_listed(out) == [fleet.failed]
    _, out, _ = await gantry(fleet, capsys, "jobs", "--node", fleet.alpha)
    assert ids_listed(out) == [fleet.queued, fleet.failed]
    _, out, _ = await gantry(fleet, capsys, "jobs", "--type", "probe")
    assert ids_listed(out) == [fleet.probe]
    _, out, _ = await gantry(fleet, capsys, "jobs", "--node", "beta", "--type", "inspect")
    assert ids_listed(out) == []
    status, out, err = await gantry(fleet, capsys, "jobs", "--limit", "1")
    assert status == 0
    assert ids_listed(out) == [fleet.probe]
    assert err == "(2 older not shown; --limit 0 shows all)\n"


async def test_jobs_json_parses_and_carries_the_proto_fields(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = await gantry(fleet, capsys, "jobs", "--json")
    assert status == 0
    listed = json.loads(out)
    assert [job["job_id"] for job in listed] == [fleet.queued, fleet.failed, fleet.probe]
    assert listed[1]["state"] == "SERVING_JOB_STATE_FAILED"
    assert listed[1]["failure"]["reason"] == "RUNTIME_INCOMPATIBLE"
    assert listed[2]["job_type"] == "SERVING_JOB_TYPE_PROBE"
    assert listed[2]["probe_id"] == fleet.probe_id

    status, out, _ = await gantry(fleet, capsys, "jobs", "show", fleet.failed, "--json")
    assert status == 0
    shown = json.loads(out)
    assert shown == listed[1]


async def test_jobs_show_prints_one_job_with_its_failure(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = await gantry(fleet, capsys, "jobs", "show", fleet.failed)
    assert (status, err) == (0, "")
    fields = {line[:15].strip(): line[15:] for line in out.splitlines()}
    assert fields["job_id"] == fleet.failed
    assert fields["type"] == "INSPECT"
    assert fields["state"] == "FAILED"
    assert fields["node"] == fleet.alpha
    assert fields["attempts"] == "1"
    assert fields["created"].startswith("2026-11-30 09:01:00Z")
    assert fields["failure"] == "RUNTIME_INCOMPATIBLE: no inspector knows this format"


async def test_bad_input_is_one_line_and_exit_1(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = new_id()
    status, out, err = await gantry(fleet, capsys, "jobs", "show", missing)
    assert (status, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: ") and err.count("\n") == 1, err
    status, _, err = await gantry(fleet, capsys, "jobs", "--deployment", "not-an-id")
    assert status == 1
    assert err.startswith("error: INVALID_ARGUMENT: ") and err.count("\n") == 1
    status, _, err = await gantry(fleet, capsys, "jobs", "--node", "gamma")
    assert status == 1
    assert err == "error: no node has the id or name 'gamma' (see `gantry nodes`)\n"
