"""`gantry check`'s verdict on one HEALTH job: healthy only when the job succeeded and no layer of
its report failed; otherwise the reason names the state or the failed layers."""

from __future__ import annotations

from gantry.cli.check_command import unhealthy_because
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg

OK = wg.HealthLayer(status=wg.HEALTH_STATUS_OK)
NOT_CHECKED = wg.HealthLayer(status=wg.HEALTH_STATUS_NOT_CHECKED)


def _job(state: int, **layers: wg.HealthLayer) -> cp.ServingJob:
    return cp.ServingJob(
        job_id="j",
        job_type=cp.SERVING_JOB_TYPE_HEALTH,
        state=state,
        health=wg.HealthReport(**layers),
    )


def test_a_succeeded_job_with_no_failed_layer_is_healthy() -> None:
    job = _job(
        cp.SERVING_JOB_STATE_SUCCEEDED, process=OK, runtime=OK, model=OK, capability=NOT_CHECKED
    )
    assert unhealthy_because(job) == ""


def test_a_failed_layer_is_named() -> None:
    broken = wg.HealthLayer(status=wg.HEALTH_STATUS_FAILED, detail="non-finite output")
    job = _job(cp.SERVING_JOB_STATE_SUCCEEDED, process=OK, runtime=OK, model=broken)
    assert unhealthy_because(job).startswith("model FAILED: ")


def test_a_job_that_did_not_succeed_says_its_state_and_reason() -> None:
    job = cp.ServingJob(
        job_id="j",
        state=cp.SERVING_JOB_STATE_FAILED,
        failure=common_pb2.Failure(reason="WORKER_UNAVAILABLE", message="stream closed"),
    )
    assert unhealthy_because(job) == "FAILED: WORKER_UNAVAILABLE: stream closed"
