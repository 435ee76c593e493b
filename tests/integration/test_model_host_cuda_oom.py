"""CUDA out of memory in a real model host child, typed, and the evidence the child observes.

There is no GPU here: the fake is at the torch.cuda boundary alone (`testing_hooks.fake_cuda_oom`,
the `torch.cuda.OutOfMemoryError` torch's allocator raises), raised inside the adapter's load or
forward pass of a real child running a real tiny model. Everything above it is the real path: the
child's typing of the failure, its answer over the pipe, the parent's error, the host serving on.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from gantry.common.errors import FailureClass, GantryError
from gantry.v1 import common_pb2, worker_gateway_pb2
from gantry.worker.model_host import testing_hooks
from gantry.worker.model_host.process import HostLaunchSpec
from tests.integration.harness import forked_host


def _spec(model_directory: Path, deployment_id: str) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=deployment_id,
        model_directory=model_directory,
        adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
        python_executable=sys.executable,
        load_timeout_s=90,
        test_hooks=True,
    )


def _assert_fake_figures(error: GantryError) -> None:
    """The figures torch's message states, and the allocator's own readings: here, on a CPU
    device, said to be unavailable and why, never zero."""
    assert error.metadata["cuda_tried_to_allocate_bytes"] == str(testing_hooks.FAKE_TRIED_BYTES)
    assert error.metadata["cuda_total_bytes"] == str(testing_hooks.FAKE_TOTAL_BYTES)
    assert error.metadata["cuda_free_bytes"] == str(testing_hooks.FAKE_FREE_BYTES)
    for reading in ("cuda_allocated", "cuda_reserved", "cuda_peak_allocated"):
        assert error.metadata[reading] == "unavailable: device is cpu", reading


async def test_cuda_oom_at_load_fails_the_load_runtime_oom_with_the_measured_figures(
    tiny_model_dir: Path,
) -> None:
    with pytest.raises(GantryError) as caught:
        await forked_host(_spec(tiny_model_dir, testing_hooks.CUDA_OOM_AT_LOAD_DEPLOYMENT))
    error = caught.value
    assert error.reason == "RUNTIME_OOM"
    assert error.failure_class is FailureClass.CONFIG
    assert "CUDA out of memory loading the model" in error.message
    assert "tried to allocate 2048.0 MiB" in error.message
    _assert_fake_figures(error)


async def test_cuda_oom_at_invoke_is_invoke_oom_and_the_host_serves_the_next_call(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-invoke-oom"))
    try:
        pid = host.pid
        with pytest.raises(GantryError) as caught:
            await host.embed([testing_hooks.CUDA_OOM_INPUT], trace_context={}, timeout_s=30)
        error = caught.value
        assert error.reason == "INVOKE_OOM"
        assert error.failure_class is FailureClass.CONFIG
        # The host's own words, not torch's (which name other processes on the device).
        assert error.message.startswith("CUDA out of memory running the request")
        assert "79.50 GiB memory in use" not in error.message
        _assert_fake_figures(error)

        # A batch the OOM was part of: its batch-mates are retried alone and answered.
        oom, healthy = await asyncio.gather(
            host.embed([testing_hooks.CUDA_OOM_INPUT], trace_context={}, timeout_s=30),
            host.embed(["hello world"], trace_context={}, timeout_s=30),
            return_exceptions=True,
        )
        assert isinstance(oom, GantryError) and oom.reason == "INVOKE_OOM"
        assert isinstance(healthy, worker_gateway_pb2.EmbedResult) and healthy.count == 1

        after = await host.embed(["the next call"], trace_context={}, timeout_s=30)
        vectors = np.frombuffer(after.float32_le, dtype="<f4")
        assert after.count == 1 and np.isfinite(vectors).all()
        assert host.alive and host.pid == pid
    finally:
        await host.stop()


async def test_offline_evidence_is_what_the_child_observed_of_itself(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-observed"))
    try:
        offline = (await host.probe_check(timeout_s=30)).offline
        assert offline.offline_env["HF_HUB_OFFLINE"] == "1"
        assert offline.opens_observed is True
        assert list(offline.remote_code_modules) == []
        # safetensors maps its file from Rust: seen in the child's maps, under the copy.
        assert list(offline.weight_files) == ["model.safetensors"]
        assert list(offline.weight_files_outside_copy) == []

        # The child changes what it would observe; the next evidence reports each change.
        await host.embed(
            [
                testing_hooks.UNSET_HUB_OFFLINE_INPUT,
                testing_hooks.REMOTE_CODE_INPUT,
                testing_hooks.FOREIGN_WEIGHTS_INPUT,
            ],
            trace_context={},
            timeout_s=30,
        )
        offline = (await host.probe_check(timeout_s=30)).offline
        assert "HF_HUB_OFFLINE" not in offline.offline_env
        assert offline.offline_env["TRANSFORMERS_OFFLINE"] == "1"
        assert list(offline.remote_code_modules) == [testing_hooks.REMOTE_CODE_MODULE]
        assert list(offline.weight_files) == ["model.safetensors"]
        (foreign,) = offline.weight_files_outside_copy
        assert Path(foreign).name == testing_hooks.FOREIGN_WEIGHTS_FILE
        assert not Path(foreign).is_relative_to(tiny_model_dir)
    finally:
        await host.stop()
