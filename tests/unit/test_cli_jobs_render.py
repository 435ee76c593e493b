"""`gantry jobs` rendering (pure): what a job acts on, its outcome in one cell, the detail view."""

from __future__ import annotations

from gantry.cli.jobs_commands import JOB_STATES, JOB_TYPES, outcome, render_job, subject
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.v1 import control_plane_pb2 as cp

OK = worker_gateway_pb2.HEALTH_STATUS_OK
FAILED = worker_gateway_pb2.HEALTH_STATUS_FAILED


def health_job() -> cp.ServingJob:
    job = cp.ServingJob(
        job_id="j1",
        job_type=cp.SERVING_JOB_TYPE_HEALTH,
        state=cp.SERVING_JOB_STATE_SUCCEEDED,
        deployment_id="d1",
        node_id="n1",
        attempt_count=1,
    )
    job.health.process.CopyFrom(worker_gateway_pb2.HealthLayer(status=OK, detail="pid 42"))
    job.health.runtime.CopyFrom(worker_gateway_pb2.HealthLayer(status=OK))
    job.health.model.CopyFrom(
        worker_gateway_pb2.HealthLayer(status=FAILED, detail="non-finite\noutput")
    )
    job.health.latency_seconds = 0.0125
    return job


def test_every_type_and_state_has_a_lowercase_cli_name() -> None:
    assert sorted(JOB_TYPES) == ["health", "inspect", "load", "probe", "unload"]
    assert sorted(JOB_STATES) == [
        "cancelled",
        "failed",
        "leased",
        "queued",
        "running",
        "succeeded",
    ]


def test_the_subject_is_the_deployment_or_the_pipeline_object() -> None:
    assert subject(cp.ServingJob(deployment_id="d1")) == "d1"
    assert subject(cp.ServingJob(probe_id="p1")) == "probe p1"
    assert subject(cp.ServingJob(assessment_id="a1")) == "assessment a1"
    assert subject(cp.ServingJob()) == "-"


def test_the_outcome_is_the_failure_else_the_health_report_else_nothing() -> None:
    failed = cp.ServingJob(
        failure=common_pb2.Failure(
            reason="LOAD_FAILED",
            message="out of\nmemory",
            failure_class=common_pb2.FAILURE_CLASS_INFRA,
        )
    )
    assert outcome(failed) == "LOAD_FAILED (INFRA): out of memory"
    assert outcome(health_job()) == "process OK, runtime OK, model FAILED in 0.013s"
    assert outcome(cp.ServingJob()) == "-"


def test_the_detail_view_names_each_health_layer_on_its_own_line() -> None:
    lines = render_job(health_job()).splitlines()
    assert lines[0].split() == ["job_id", "j1"]
    layers = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines if line[:2] == "  "}
    assert layers == {
        "process": "OK (pid 42)",
        "runtime": "OK",
        "model": "FAILED (non-finite output)",
    }
    assert any(line.startswith("lease expires") and line.endswith("-") for line in lines)
