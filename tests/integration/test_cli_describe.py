"""`gantry describe`, `--output json` on every list, and the state directory found from any working
directory, against the real in-process control plane and scheduler (SQLite and PostgreSQL) with a
scripted worker. The CLI runs in-process (`main([...])`, output captured)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of
from tests.integration.scripted_worker import ScriptedWorker

UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
EVIDENCE_KINDS = ["approval", "candidate", "probe", "profile", "assessment", "artifacts"]


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


@pytest.fixture
def state_dir(gantry: Pipeline, tmp_path: Path) -> Path:
    directory = tmp_path / "project" / ".gantry"
    directory.mkdir(parents=True)
    (directory / "operator.token").write_text(gantry.harness.operator_token + "\n")
    return directory


async def cli(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    capsys.readouterr()
    # The CLI is synchronous; the servers share this event loop, so it runs in a thread.
    status = await asyncio.to_thread(gantry_cli, list(arguments))
    out, err = capsys.readouterr()
    return status, out, err


def globals_for(gantry: Pipeline, state_dir: Path) -> list[str]:
    return ["--address", gantry.harness.address, "--state-dir", str(state_dir)]


def failing_loads(worker: ScriptedWorker) -> None:
    def answer(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") != "load":
            return worker.default_answer(job)
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        result.failure.CopyFrom(
            common_pb2.Failure(reason="RUNTIME_INCOMPATIBLE", message="cuda on a cpu build")
        )
        return result

    worker.answer = answer


async def deployed(gantry: Pipeline, state: int) -> cp.Deployment:
    approval = await gantry.approved()
    created = await gantry.deploy(approval.approval_id, "minilm")
    return await gantry.harness.wait_deployment(created.deployment_id, state)


async def test_describe_a_failed_deployment_shows_the_reason_the_evidence_and_the_history(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
):
    failing_loads(await gantry.worker("solo"))
    failed = await deployed(gantry, cp.DEPLOYMENT_STATE_FAILED)
    where = globals_for(gantry, state_dir)

    status, out, err = await cli(capsys, *where, "describe", "deployment", failed.deployment_id)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[:2] == [f"deployment   {failed.deployment_id}", "state        FAILED"]
    assert "last failure RUNTIME_INCOMPATIBLE: cuda on a cpu build" in lines
    history = lines[lines.index("history") + 1 :]
    assert history[0].split() == ["AT", "SUBJECT", "CHANGE"]
    assert any("created -> PENDING" in line for line in history)
    [arrival] = [
        line
        for line in history
        if line.endswith("-> FAILED (RUNTIME_INCOMPATIBLE: cuda on a cpu build)")
        and "deployment" in line
    ]
    assert failed.deployment_id in arrival
    assert any("deployment.create by" in line for line in history)

    status, out, err = await cli(
        capsys, *where, "describe", "deployment", failed.deployment_id, "--output", "json"
    )
    assert (status, err) == (0, "")
    described = json.loads(out)
    assert (described["kind"], described["state"]) == ("deployment", "FAILED")
    assert described["last_failure"]["reason"] == "RUNTIME_INCOMPATIBLE"
    assert [link["kind"] for link in described["evidence"]] == EVIDENCE_KINDS
    assert described["evidence"][1]["state"] == "LAB_READY"
    times = [entry["at"] for entry in described["history"]]
    assert times == sorted(times)
    assert {entry["source"] for entry in described["history"]} == {"transition", "event"}
    last_move = [e for e in described["history"] if e.get("subject_kind") == "deployment"][-1]
    assert (last_move["to_state"], last_move["reason"]) == ("FAILED", "RUNTIME_INCOMPATIBLE")


async def test_describe_covers_every_kind_and_an_unknown_id_is_not_found_once(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
):
    await gantry.worker("solo")
    ready = await deployed(gantry, cp.DEPLOYMENT_STATE_READY)
    where = globals_for(gantry, state_dir)
    status, out, _ = await cli(
        capsys, *where, "describe", "deployment", ready.deployment_id, "-o", "json"
    )
    assert status == 0
    chain = {link["kind"]: link["id"] for link in json.loads(out)["evidence"]}
    residency = ready.residencies[0]
    jobs = await gantry.op.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=ready.deployment_id), metadata=gantry.md
    )
    subjects = {
        **chain,
        "node": residency.node_id,
        "residency": residency.residency_id,
        "job": jobs.jobs[0].job_id,
    }
    for kind, ident in subjects.items():
        status, out, err = await cli(capsys, *where, "describe", kind, ident, "--json")
        assert (status, err) == (0, ""), (kind, err)
        described = json.loads(out)
        assert (described["kind"], described["id"]) == (kind, ident)
        assert described["record"], kind
    residency_view = json.loads(
        (await cli(capsys, *where, "describe", "residency", residency.residency_id, "--json"))[1]
    )
    assert [link["kind"] for link in residency_view["evidence"]] == ["deployment", *EVIDENCE_KINDS]
    assert [(e["from_state"], e["to_state"]) for e in residency_view["history"]] == [
        ("", "COLD"),
        ("COLD", "LOADING"),
        ("LOADING", "RESIDENT"),
    ]
    node_view = json.loads(
        (await cli(capsys, *where, "describe", "node", residency.node_id, "--json"))[1]
    )
    assert [r["residency_id"] for r in node_view["residencies"]] == [residency.residency_id]

    for kind in ("deployment", "residency", "artifacts"):
        status, out, err = await cli(capsys, *where, "describe", kind, UNKNOWN_ID)
        assert (status, out) == (1, ""), kind
        assert err.count("NOT_FOUND") == 1 and err.startswith("error: NOT_FOUND"), err


async def test_every_list_prints_json_that_parses_back(
    gantry: Pipeline, state_dir: Path, capsys: pytest.CaptureFixture[str]
):
    await gantry.worker("solo")
    ready = await deployed(gantry, cp.DEPLOYMENT_STATE_READY)
    probes = await gantry.op.ListProbes(cp.ListProbesRequest(), metadata=gantry.md)
    jobs = await gantry.op.ListServingJobs(cp.ListServingJobsRequest(), metadata=gantry.md)
    await gantry.op.SetTenantPolicy(
        cp.SetTenantPolicyRequest(policy=common_pb2.TenantPolicy(tenant_id="acme", weight=2)),
        metadata=gantry.md,
    )
    where = globals_for(gantry, state_dir)
    commands: dict[tuple[str, ...], type] = {
        ("deployments",): list,
        ("candidates",): list,
        ("probe", "list"): list,
        ("probe", "show", probes.probes[0].probe_id): dict,
        ("jobs",): list,
        ("jobs", "show", jobs.jobs[0].job_id): dict,
        ("tenants",): list,
        ("tenants", "list"): list,
        ("tenants", "show", "acme"): dict,
        ("queue",): dict,
        ("status",): dict,
        ("events",): list,
        ("inventory", "solo"): dict,
    }
    for command, shape in commands.items():
        for flag in ("--output=json", "--json"):
            status, out, err = await cli(capsys, *where, *command, flag)
            assert (status, err) == (0, ""), (command, err)
            assert isinstance(json.loads(out), shape), command
    deployments = json.loads((await cli(capsys, *where, "deployments", "-o", "json"))[1])
    assert [d["deployment_id"] for d in deployments] == [ready.deployment_id]
    assert deployments[0]["state"] == "DEPLOYMENT_STATE_READY"
    status, table, _ = await cli(capsys, *where, "deployments")
    assert status == 0 and table.splitlines()[0].split() == [
        *("ID", "CAPABILITY", "STATE", "READY/WANTED", "NODE", "RESIDENCY"),
        *("WHY", "NOT", "ALL", "READY"),
    ]


async def test_the_state_directory_is_found_from_a_subdirectory_of_the_project(
    gantry: Pipeline,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    await gantry.worker("solo")
    nested = state_dir.parent / "src" / "deep"
    nested.mkdir(parents=True)
    monkeypatch.delenv("GANTRY_STATE_DIR", raising=False)
    monkeypatch.chdir(nested)

    status, out, err = await cli(
        capsys, "--address", gantry.harness.address, "describe", "node", UNKNOWN_ID
    )
    # It reached the server with the project's operator token: the answer is about the node.
    assert (status, out) == (1, "")
    assert err.startswith("error: NOT_FOUND"), err

    status, out, err = await cli(capsys, "--address", gantry.harness.address, "jobs", "-o", "json")
    assert (status, err) == (0, "")

    # The environment wins over walking up, and names where it looked when the file is missing.
    elsewhere = state_dir.parent.parent / "elsewhere"
    monkeypatch.setenv("GANTRY_STATE_DIR", str(elsewhere))
    status, out, err = await cli(capsys, "--address", gantry.harness.address, "deployments")
    assert (status, out) == (1, "")
    assert f"state directory {elsewhere}" in err and "given by $GANTRY_STATE_DIR" in err


async def test_a_missing_state_directory_is_named_with_how_it_was_chosen(
    gantry: Pipeline,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    lost = tmp_path / "no-project-here"
    lost.mkdir()
    monkeypatch.delenv("GANTRY_STATE_DIR", raising=False)
    monkeypatch.chdir(lost)
    if any((directory / ".gantry").is_dir() for directory in (lost, *lost.parents)):
        pytest.skip("a .gantry/ above the test's temporary directory")  # a shared machine

    status, out, err = await cli(capsys, "--address", gantry.harness.address, "deployments")
    assert (status, out) == (1, "")
    assert err.count("\n") == 1, err  # one line
    assert "no operator token" in err
    assert f"state directory {lost / '.gantry'}" in err
    assert f"no .gantry/ in {lost} or any directory above it" in err
    assert "--state-dir" in err and "GANTRY_STATE_DIR" in err
