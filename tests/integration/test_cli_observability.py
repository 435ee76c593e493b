"""`gantry status`, `events`, `inventory` and `reclaim` against the real in-process control plane
and scheduler (SQLite and PostgreSQL), with scripted workers (real gRPC clients of the worker
protocol) holding the replicas. The CLI runs in-process (`main([...])`, output captured), and
`events --follow` as a real child process read line by line, across a control-plane restart on
the same port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.common.clock import ManualClock
from gantry.common.ids import new_id
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.platform.state_machines import JobState, JobType
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import (
    CTRL_C_REACHES_IT,
    Harness,
    restarted_control_plane,
    running_gantry,
    wait_for,
)
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of
from tests.integration.pipeline_support import two_replicas as shared_two_replicas
from tests.integration.scripted_worker import ScriptedWorker

GANTRY = Path(sys.executable).with_name("gantry")  # the installed entry point
RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(
        database_url, tmp_path, make_model_dir(tmp_path), clock=ManualClock()
    ):
        yield pipeline


def state_dir_for(harness: Harness, tmp_path: Path) -> Path:
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    (state_dir / "operator.token").write_text(harness.operator_token + "\n")
    return state_dir


async def cli(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, str, str]:
    argv = ["--address", harness.address, "--state-dir", str(state_dir_for(harness, tmp_path))]
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, [*argv, *arguments])
    out, err = capsys.readouterr()
    return status, out, err


async def two_replicas(gantry: Pipeline) -> tuple[cp.Deployment, dict[str, ScriptedWorker]]:
    """Two RESIDENT replicas (pipeline_support.two_replicas), and one outcome observed, so the
    capability's health shows."""
    deployment, workers = await shared_two_replicas(gantry)
    await gantry.embed("minilm")
    return deployment, workers


async def failed_job(gantry: Pipeline, node_id: str) -> str:
    """A failed INSPECT job as the lifecycle leaves one, written straight to the database."""
    assert gantry.clock is not None
    async with gantry.harness.control_plane.database.transaction() as session:
        row = await jobs.create_job(
            session,
            job_type=JobType.INSPECT,
            node_id=node_id,
            now=gantry.clock.now(),
            assessment_id=new_id(),
        )
        row.state = JobState.FAILED
        row.failure_reason = "RUNTIME_INCOMPATIBLE"
        row.failure_message = "no inspector\nknows this format"
        row.attempt_count = 1
        await session.flush()
        return row.job_id


# ---- status ---------------------------------------------------------------------------------


async def test_status_shows_the_whole_system_on_one_screen_and_as_json(
    gantry: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    deployment, _ = await two_replicas(gantry)
    left = await gantry.node("left")
    await failed_job(gantry, left.node_id)

    status, out, err = await cli(gantry.harness, tmp_path, capsys, "status")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) <= 40, out
    assert lines[0].startswith(f"gantry at {gantry.harness.address}")
    nodes = lines[lines.index("NODES (2)") + 1 : lines.index("DEPLOYMENTS (1)")]
    assert [line.split()[:2] for line in nodes[1:]] == [
        ["left", "CONNECTED"],
        ["right", "CONNECTED"],
    ]
    assert all(line.split()[-2] == "1" for line in nodes[1:])  # one resident each
    row = lines[lines.index("DEPLOYMENTS (1)") + 2]
    assert deployment.deployment_id in row
    assert row.split()[:4] == ["minilm", "READY", "2/2", "yes"]
    bindings = lines[lines.index("BINDINGS (1)") + 2]
    assert bindings.split() == ["minilm", deployment.deployment_id, "-"]
    assert "  healthy: minilm" in lines
    [queue] = [line for line in lines if line.startswith("QUEUE")]
    assert "queued 0, in flight 0, rejected 0" in queue
    assert "BREAKERS  all closed" in lines
    assert "  UNCERTAIN residencies: none" in lines
    failures = lines[lines.index("RECENT FAILURES (newest first, 1)") + 1 :]
    assert len(failures) == 1
    assert "INSPECT on left" in failures[0]
    assert "RUNTIME_INCOMPATIBLE: no inspector knows this format" in failures[0]

    status, out, err = await cli(gantry.harness, tmp_path, capsys, "status", "--json")
    assert (status, err) == (0, "")
    snapshot = json.loads(out)
    assert sorted(n["name"] for n in snapshot["registry"]["nodes"]) == ["left", "right"]
    assert snapshot["registry"]["bindings"][0]["deployment_id"] == deployment.deployment_id
    assert snapshot["recent_failed_jobs"][0]["failure"]["reason"] == "RUNTIME_INCOMPATIBLE"
    assert "queue" in snapshot


async def test_status_says_why_the_queue_is_missing_when_the_scheduler_is_down(
    gantry: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    await gantry.harness.scheduler_server.stop(grace=0)
    status, out, err = await cli(gantry.harness, tmp_path, capsys, "status")
    assert (status, err) == (0, "")
    [queue] = [line for line in out.splitlines() if line.startswith("QUEUE")]
    assert queue.startswith("QUEUE  unavailable: SCHEDULER_UNAVAILABLE")
    assert "BREAKERS" not in out  # nothing to say about breakers without the scheduler
    assert "RECENT FAILURES  none" in out


# ---- inventory and reclaim ------------------------------------------------------------------


async def test_inventory_by_name_and_by_id_and_of_an_unknown_node(
    gantry: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    deployment, workers = await two_replicas(gantry)
    left = await gantry.node("left")
    # The inventory is the one of the node's last Hello: the left worker reconnects (same
    # generation) and its Hello lists the model host it holds.
    reconnected = ScriptedWorker(generation=workers["left"].generation)
    reconnected.residents = dict(workers["left"].residents)
    await workers["left"].stop()
    await reconnected.start(gantry.harness.channel, gantry.harness.credentials["left"])
    gantry.workers.append(reconnected)

    async def reported() -> bool:
        inventory = await gantry.op.GetInventory(
            cp.GetInventoryRequest(node_id=left.node_id), metadata=gantry.md
        )
        return len(inventory.managed) == 1

    await wait_for(reported, what="the left worker's inventory report")
    status, by_name, err = await cli(gantry.harness, tmp_path, capsys, "inventory", "left")
    assert (status, err) == (0, "")
    assert by_name.startswith(f"node        {left.node_id} (left)\n")
    managed = by_name.split("MANAGED MODEL HOSTS\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert managed[0].split()[:3] == ["DEPLOYMENT", "STATE", "PID"]
    assert [line.split()[:2] for line in managed[1:]] == [[deployment.deployment_id, "RESIDENT"]]
    assert "host.ram" in by_name and "sentence_transformers" in by_name
    # No GPU reading from this worker: said, not claimed to be no GPU processes.
    assert "\nGPUS: no heartbeat of this node has reported its GPUs yet\n" in by_name

    status, as_json, err = await cli(
        gantry.harness, tmp_path, capsys, "inventory", left.node_id, "--json"
    )
    assert (status, err) == (0, "")
    assert json.loads(as_json)["node_id"] == left.node_id

    status, out, err = await cli(gantry.harness, tmp_path, capsys, "inventory", "nowhere")
    assert (status, out) == (1, "")
    assert err == "error: no node has the id or name 'nowhere' (see `gantry nodes`)\n"
    status, out, err = await cli(gantry.harness, tmp_path, capsys, "inventory", UNKNOWN_ID)
    assert (status, out) == (1, "")
    assert err == f"error: NOT_FOUND: no node {UNKNOWN_ID} (see `gantry nodes`)\n"


async def test_reclaim_exits_0_only_for_a_verified_cold_residency(
    gantry: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    deployment, workers = await two_replicas(gantry)
    left = await gantry.node("left")
    [verified] = [r for r in deployment.residencies if r.node_id == left.node_id]
    [unverified] = [r for r in deployment.residencies if r.node_id != left.node_id]

    status, out, err = await cli(
        gantry.harness, tmp_path, capsys, "reclaim", verified.residency_id, "--timeout", "20"
    )
    assert (status, err) == (0, ""), out
    fields = dict(
        line.split(None, 1) for line in out.replace("unload job", "unload_job").splitlines()
    )
    assert fields["residency"] == verified.residency_id
    assert (fields["state"], fields["verified"]) == ("COLD", "yes")
    assert fields["evidence"].startswith(f"pid {verified.pid} exited")
    assert fields["unload_job"].endswith(" SUCCEEDED")

    # The other worker cannot verify its host exited: UNCERTAIN, exit 1 with the reason.
    worker = workers["right"]
    answer = worker.answer

    def unload_without_exit(job: Any) -> Any:
        result = answer(job)
        if job.WhichOneof("spec") == "unload":
            result.unload.process_exited = False
        return result

    worker.answer = unload_without_exit
    status, out, err = await cli(
        gantry.harness, tmp_path, capsys, "reclaim", unverified.residency_id, "--json"
    )
    assert status == 1
    response = json.loads(out)
    assert response["residency"]["state"] == "RESIDENCY_STATE_UNCERTAIN"
    assert not response.get("reclaim_verified", False)
    assert err.startswith("not reclaimed: UNCERTAIN: RECLAIM_UNVERIFIED")
    assert err.count("\n") == 1

    status, out, err = await cli(gantry.harness, tmp_path, capsys, "reclaim", UNKNOWN_ID)
    assert (status, out) == (1, "")
    assert err.count("NOT_FOUND") == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: NOT_FOUND: no residency {UNKNOWN_ID}")


# ---- events ---------------------------------------------------------------------------------


async def create_keys(harness: Harness, *names: str) -> list[str]:
    ids = []
    for name in names:
        key = await harness.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="tenant-audit", name=name), metadata=harness.op_md
        )
        ids.append(key.api_key_id)
    return ids


@pytest.fixture
async def plain(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """Scheduler and control plane on the real clock, no workers."""
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root, run_reconciler=False) as harness:
        yield harness


async def test_events_lists_the_newest_page_oldest_first_and_pages_by_cursor(
    plain: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    keys = await create_keys(plain, *(f"key-{i}" for i in range(5)))
    await plain.register_node("audited")  # another action: filtered out below

    status, out, err = await cli(
        plain, tmp_path, capsys, "events", "--action", "api_key.create", "--limit", "3"
    )
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[3] for line in lines] == ["api_key.create"] * 3  # after the time
    assert [line.split("api_key_id=")[1].split()[0] for line in lines] == keys[-3:]
    ids = [int(line.split()[0].removeprefix("#")) for line in lines]
    assert ids == sorted(ids)

    status, out, err = await cli(plain, tmp_path, capsys, "events", "--limit", "1", "--json")
    assert (status, err) == (0, "")
    [newest] = json.loads(out)
    assert newest["action"] != "api_key.create"  # the node registration came last

    # --after: the events right after a cursor, oldest first, with the next cursor on stderr.
    status, out, err = await cli(
        plain,
        tmp_path,
        capsys,
        "events",
        "--action",
        "api_key.create",
        "--after",
        str(ids[0] - 1),
        "--limit",
        "2",
    )
    assert status == 0
    after = [int(line.split()[0].removeprefix("#")) for line in out.splitlines()]
    assert after == ids[:2]
    assert err == f"(more after #{ids[1]}: --after {ids[1]})\n"

    status, out, err = await cli(plain, tmp_path, capsys, "events", "--subject-kind", "nothing")
    assert (status, out, err) == (0, "", "no events\n")


async def read_line(stream: asyncio.StreamReader) -> str:
    line = await asyncio.wait_for(stream.readline(), timeout=30)
    assert line, "the follower's stdout ended"
    return line.decode()


def key_of(line: str) -> str:
    return line.split("api_key_id=")[1].split()[0]


async def test_events_follow_streams_live_and_resumes_across_a_control_plane_restart(
    plain: Harness, database_url: str, tmp_path: Path
):
    history = await create_keys(plain, "a", "b")
    state_dir = state_dir_for(plain, tmp_path)
    follower = await asyncio.create_subprocess_exec(
        *CTRL_C_REACHES_IT,
        str(GANTRY),
        "--address",
        plain.address,
        "--state-dir",
        str(state_dir),
        "events",
        "--follow",
        "--action",
        "api_key.create",
        "--limit",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with contextlib.AsyncExitStack() as restart:
        try:
            assert follower.stdout is not None and follower.stderr is not None
            # The newest two first (history), then live events as they commit.
            seen = [await read_line(follower.stdout) for _ in range(2)]
            assert [key_of(line) for line in seen] == history
            [live] = await create_keys(plain, "c")
            seen.append(await read_line(follower.stdout))
            assert key_of(seen[-1]) == live

            # Stopped after the follower (the stack's exit), so it sees one outage only.
            await restart.enter_async_context(
                restarted_control_plane(
                    plain, database_url, reconciler=ReconcilerSettings(), run_reconciler=False
                )
            )
            after_restart = await create_keys(plain, "d", "e")
            seen += [await read_line(follower.stdout) for _ in range(2)]
            assert [key_of(line) for line in seen[-2:]] == after_restart
            ids = [int(line.split()[0].removeprefix("#")) for line in seen]
            assert ids == sorted(set(ids))  # in order, none twice, none skipped
        finally:
            if follower.returncode is None:
                follower.send_signal(signal.SIGINT)  # Ctrl-C
            status = await asyncio.wait_for(follower.wait(), timeout=30)
    err = (await follower.stderr.read()).decode()
    assert status == 0, err
    assert "Traceback" not in err
    lost = [line for line in err.splitlines() if line.startswith("lost the event stream")]
    assert len(lost) == 1, err  # once per outage
    assert "UNAVAILABLE" in lost[0] or "CANCELLED" in lost[0]
    assert f"reconnecting after {seen[2].split()[0]}" in lost[0]
    assert any(line.startswith("reconnected; resuming after #") for line in err.splitlines())
