"""The state history: every recorded change of a deployment, residency, node and job, written in
the transaction that makes it, served by ListStateTransitions. Both stores run every scenario."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of, refusal
from tests.integration.scripted_worker import ScriptedWorker


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


async def _history(gantry: Pipeline, kind: str, subject_id: str) -> list[cp.StateTransition]:
    listed = await gantry.op.ListStateTransitions(
        cp.ListStateTransitionsRequest(subject_kind=kind, subject_id=subject_id, page_size=1000),
        metadata=gantry.md,
    )
    return list(listed.transitions)


def _moves(transitions: list[cp.StateTransition], kind: str) -> list[tuple[str, str]]:
    return [(t.from_state, t.to_state) for t in transitions if t.subject_kind == kind]


async def _deployed(gantry: Pipeline, worker: ScriptedWorker) -> cp.Deployment:
    approval = await gantry.approved()
    created = await gantry.deploy(approval.approval_id, "minilm")
    worker.deployment_id = created.deployment_id
    return created


def _failing_loads(worker: ScriptedWorker) -> None:
    """Loads fail with a configuration error (not INFRA: no retry); the rest answers as usual."""

    def answer(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") != "load":
            return worker.default_answer(job)
        result = wg.JobResult(job_id=job.job_id, lease_token=job.lease_token)
        result.failure.CopyFrom(
            common_pb2.Failure(reason="RUNTIME_INCOMPATIBLE", message="cuda on a cpu build")
        )
        return result

    worker.answer = answer


async def test_a_deploy_records_each_machines_walk_and_serving_records_nothing(gantry: Pipeline):
    worker = await gantry.worker("solo")
    worker.answer_invokes = True
    created = await _deployed(gantry, worker)
    ready = await gantry.harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_READY)

    history = await _history(gantry, "deployment", ready.deployment_id)
    assert _moves(history, "deployment") == [
        ("", "PENDING"),
        ("PENDING", "LOADING"),
        ("LOADING", "READY"),
    ]
    residency_id = ready.residencies[0].residency_id
    residency_moves = _moves(history, "residency")
    assert residency_moves == [("", "COLD"), ("COLD", "LOADING"), ("LOADING", "RESIDENT")]
    assert {t.subject_id for t in history if t.subject_kind == "residency"} == {residency_id}
    job_moves = _moves(history, "job")
    assert job_moves[0] == ("", "QUEUED")
    assert job_moves[-1][1] == "SUCCEEDED"
    assert ("QUEUED", "LEASED") in job_moves
    assert all(
        t.deployment_id == ready.deployment_id for t in history if t.subject_kind != "deployment"
    )
    assert [t.at.ToDatetime() for t in history] == sorted(t.at.ToDatetime() for t in history)
    # A residency's own history is what the deployment's shows of it.
    assert _moves(await _history(gantry, "residency", residency_id), "residency") == residency_moves

    node = await gantry.node("solo")
    assert _moves(await _history(gantry, "node", node.node_id), "node") == [
        ("", "REGISTERED"),
        ("REGISTERED", "CONNECTED"),
    ]

    for _ in range(3):
        await gantry.embed("minilm")
    assert await _history(gantry, "deployment", ready.deployment_id) == history


async def test_a_failed_load_records_the_failure_where_the_deployment_arrived(gantry: Pipeline):
    worker = await gantry.worker("solo")
    _failing_loads(worker)
    created = await _deployed(gantry, worker)
    failed = await gantry.harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_FAILED)
    assert failed.last_failure.reason == "RUNTIME_INCOMPATIBLE"

    history = await _history(gantry, "deployment", created.deployment_id)
    deployment_rows = [t for t in history if t.subject_kind == "deployment"]
    assert deployment_rows[-1].to_state == "FAILED"
    assert (deployment_rows[-1].reason, deployment_rows[-1].message) == (
        "RUNTIME_INCOMPATIBLE",
        "cuda on a cpu build",
    )
    # Only the step that ended the walk carries the failure.
    assert [t.reason for t in deployment_rows[:-1]] == [""] * (len(deployment_rows) - 1)
    failed_jobs = [t for t in history if t.subject_kind == "job" and t.to_state == "FAILED"]
    assert [(t.reason, t.message) for t in failed_jobs] == [
        ("RUNTIME_INCOMPATIBLE", "cuda on a cpu build")
    ]
    back_to_cold = [t for t in history if t.subject_kind == "residency" and t.to_state == "COLD"]
    assert back_to_cold[-1].reason == "RUNTIME_INCOMPATIBLE"


async def test_transitions_page_oldest_first_and_a_bad_kind_is_refused(gantry: Pipeline):
    worker = await gantry.worker("solo")
    created = await _deployed(gantry, worker)
    await gantry.harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_READY)
    whole = await _history(gantry, "deployment", created.deployment_id)
    assert len(whole) >= 9

    paged: list[cp.StateTransition] = []
    token = ""
    while True:
        page = await gantry.op.ListStateTransitions(
            cp.ListStateTransitionsRequest(
                subject_kind="deployment",
                subject_id=created.deployment_id,
                page_size=2,
                page_token=token,
            ),
            metadata=gantry.md,
        )
        assert len(page.transitions) <= 2
        paged.extend(page.transitions)
        token = page.next_page_token
        if not token:
            break
    assert paged == whole

    for request in (
        cp.ListStateTransitionsRequest(subject_kind="artifact", subject_id=created.deployment_id),
        cp.ListStateTransitionsRequest(subject_kind="", subject_id=created.deployment_id),
        cp.ListStateTransitionsRequest(subject_kind="deployment", subject_id=""),
        cp.ListStateTransitionsRequest(
            subject_kind="deployment",
            subject_id=created.deployment_id,
            page_token="bm90LWEtbnVtYmVy",
        ),
    ):
        code, reason = await refusal(gantry.op.ListStateTransitions(request, metadata=gantry.md))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


async def test_a_subject_without_history_lists_nothing(gantry: Pipeline):
    assert await _history(gantry, "job", "00000000-0000-4000-8000-000000000000") == []
