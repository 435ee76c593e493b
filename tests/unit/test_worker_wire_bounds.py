"""The worker protocol's size bounds (nodes/wire_bounds.py): one table, checked on receipt."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.common.inference_limits import DEFAULT_LIMITS, InferenceLimits
from gantry.controlplane.nodes.wire_bounds import (
    FIELD_BOUNDS,
    MAX_EMBED_DIM,
    check_worker_message,
    worker_receive_limit_bytes,
)
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

JOB_ID = "0b7c2f4e-9f1a-4d55-8f0e-2d3c1b0a9e88"


def refused(message: wg.WorkerMessage) -> GantryError:
    with pytest.raises(GantryError) as caught:
        check_worker_message(message)
    return caught.value


def test_every_table_key_names_a_field_of_the_worker_protocol():
    for name in FIELD_BOUNDS:
        message_name, field_name = name.removeprefix("gantry.v1.").rsplit(".", 1)
        descriptor = (
            wg.DESCRIPTOR.message_types_by_name.get(message_name)
            or common_pb2.DESCRIPTOR.message_types_by_name[message_name]
        )
        assert field_name in descriptor.fields_by_name, name


def test_what_a_real_worker_sends_passes():
    check_worker_message(
        wg.WorkerMessage(
            node_id=JOB_ID,
            job_update=wg.JobUpdate(job_id=JOB_ID, lease_token="t" * 80, progress="loading"),
        )
    )
    check_worker_message(
        wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=[JOB_ID] * 100, resident_count=3))
    )
    vectors = wg.EmbedResult(count=1024, dim=1024, float32_le=b"\0" * (1024 * 1024 * 4))
    check_worker_message(
        wg.WorkerMessage(invoke_result=wg.InvokeResult(request_id=JOB_ID, embed=vectors))
    )


def test_an_8_mb_progress_string_is_refused_naming_the_field_not_its_text():
    error = refused(
        wg.WorkerMessage(job_update=wg.JobUpdate(job_id=JOB_ID, progress="x" * 8_000_000))
    )
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata == {
        "field": "WorkerMessage.job_update.progress",
        "limit": "4096",
        "value": "8000000",
    }
    assert "xxxx" not in error.message


def test_a_1_mb_job_id_is_refused():
    error = refused(wg.WorkerMessage(job_result=wg.JobResult(job_id="j" * 1_000_000)))
    assert error.metadata["field"] == "WorkerMessage.job_result.job_id"


def test_a_heartbeat_naming_40000_jobs_is_refused_by_count():
    error = refused(wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=[JOB_ID] * 40_000)))
    assert error.metadata == {
        "field": "WorkerMessage.heartbeat.active_job_ids",
        "limit": "4096",
        "value": "40000",
    }


def test_each_entry_of_a_repeated_string_is_bounded_too():
    error = refused(wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=[JOB_ID, "y" * 65])))
    assert error.metadata["field"] == "WorkerMessage.heartbeat.active_job_ids[1]"


def test_nested_messages_and_maps_are_walked():
    failure = common_pb2.Failure(reason="LOAD_FAILED", message="m" * (64 * 1024 + 1))
    error = refused(wg.WorkerMessage(job_result=wg.JobResult(job_id=JOB_ID, failure=failure)))
    assert error.metadata["field"] == "WorkerMessage.job_result.failure.message"
    environment = wg.RuntimeEnvironment(versions={"torch": "v" * 257})
    error = refused(wg.WorkerMessage(hello=wg.Hello(environments=[environment])))
    assert error.metadata["field"] == "WorkerMessage.hello.environments[0].versions[]"
    residents = [wg.ResidentModel(deployment_id=JOB_ID)] * 1025
    error = refused(
        wg.WorkerMessage(
            inventory_report=wg.InventoryReport(inventory=wg.Inventory(residents=residents))
        )
    )
    assert error.metadata["field"] == "WorkerMessage.inventory_report.inventory.residents"


def test_a_field_the_table_does_not_name_has_the_default_bound():
    error = refused(wg.WorkerMessage(hello=wg.Hello(agent_version="v" * (16 * 1024 + 1))))
    assert error.metadata["field"] == "WorkerMessage.hello.agent_version"


def test_the_receive_limit_fits_the_widest_legal_embed_result():
    limit = worker_receive_limit_bytes(DEFAULT_LIMITS)
    widest = wg.WorkerMessage(
        invoke_result=wg.InvokeResult(
            request_id=JOB_ID,
            embed=wg.EmbedResult(
                count=DEFAULT_LIMITS.max_inputs,
                dim=MAX_EMBED_DIM,
                float32_le=b"\0" * (DEFAULT_LIMITS.max_inputs * MAX_EMBED_DIM * 4),
            ),
        )
    )
    assert widest.ByteSize() <= limit
    assert limit == 1024 * 1024 + 1024 * 8192 * 4  # 33 MiB with the default limits
    assert worker_receive_limit_bytes(InferenceLimits(max_inputs=2048)) > limit


def test_a_heartbeats_gpu_reading_is_bounded_in_gpus_and_processes_per_gpu():
    gpu = wg.GpuUsage(device=0, processes=[wg.GpuProcess(pid=pid) for pid in range(256)])
    check_worker_message(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[gpu] * 64)))
    crowded = wg.GpuUsage(device=0, processes=[wg.GpuProcess(pid=pid) for pid in range(257)])
    error = refused(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[crowded])))
    assert error.metadata["field"] == "WorkerMessage.heartbeat.gpus[0].processes"
    error = refused(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[gpu] * 65)))
    assert (error.metadata["field"], error.metadata["limit"]) == (
        "WorkerMessage.heartbeat.gpus",
        "64",
    )
