"""A probe's conversation with a real model host child, frame by frame over its private pipe.

HostLoad -> HostReady -> ProbeCheck -> ProbeResult -> Shutdown -> HostUnloaded -> exit 0, for
both adapters, on this machine's CPU: the child measures its own RSS from the kernel, says why it
has no CUDA readings, leaves NVML to the worker and records how it stayed offline.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.environments import host_environment
from gantry.worker.model_host.framing import read_frame, write_frame
from gantry.worker.model_host.host_process import CHILD_MODULE
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost

EXIT_LOAD_FAILED = 2
CUDA_FIELDS = (
    "cuda_allocated_before_load",
    "cuda_allocated_after_load",
    "cuda_reserved_after_load",
    "cuda_peak_allocated",
)
NVML_FIELDS = ("nvml_device_total", "nvml_device_used", "nvml_process_used")


@dataclass
class RawChild:
    """A model host child driven by hand: the test plays the worker's side of the pipe."""

    process: subprocess.Popen[bytes]
    requests: BinaryIO
    responses: BinaryIO
    stderr_path: Path

    def send(self, request: model_host_pb2.HostRequest) -> None:
        write_frame(self.requests, request)

    def receive(self) -> model_host_pb2.HostResponse | None:
        payload = read_frame(self.responses)
        return None if payload is None else model_host_pb2.HostResponse.FromString(payload)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@pytest.fixture
def spawn_child(tmp_path: Path) -> Iterator[object]:
    children: list[RawChild] = []
    private_dirs: list[Path] = []

    def spawn(deployment_id: str) -> RawChild:
        # What ModelHost.start does: a private 0700 directory, an allow-listed environment.
        private_dir = Path(tempfile.mkdtemp(prefix=f"gantry-host-{deployment_id}-"))
        private_dirs.append(private_dir)
        scratch_dir = private_dir / "tmp"
        scratch_dir.mkdir(mode=0o700)
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stderr_path = tmp_path / f"{deployment_id}.stderr"
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-m",
                    CHILD_MODULE,
                    "--deployment-id",
                    deployment_id,
                    "--parent-pid",
                    str(os.getpid()),
                    "--channel-fd",
                    str(child_end.fileno()),
                    "--private-dir",
                    str(private_dir),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(child_end.fileno(),),
                cwd=private_dir,
                env=host_environment(
                    dict(os.environ), private_dir=private_dir, scratch_dir=scratch_dir
                ),
            )
        child_end.close()
        parent_end.settimeout(120)
        child = RawChild(
            process=process,
            requests=parent_end.makefile("wb"),
            responses=parent_end.makefile("rb"),
            stderr_path=stderr_path,
        )
        parent_end.close()  # the makefiles keep the socket open
        children.append(child)
        return child

    yield spawn
    for child in children:
        if child.process.poll() is None:
            child.process.kill()
        child.process.wait(timeout=10)
        child.requests.close()
        child.responses.close()
    for private_dir in private_dirs:
        shutil.rmtree(private_dir, ignore_errors=True)


def _load(
    adapter: str, model_directory: Path, deployment_id: str, *, max_batch_size: int = 0
) -> model_host_pb2.HostRequest:
    return model_host_pb2.HostRequest(
        request_id=0,
        load=model_host_pb2.HostLoad(
            deployment_id=deployment_id,
            model_directory=str(model_directory),
            adapter=common_pb2.AdapterSettings(
                adapter=adapter, device="cpu", max_batch_size=max_batch_size
            ),
        ),
    )


# The tiny models' declared limit (tests/fixtures/tiny_model.py): the worst case's input length.
TINY_MAX_SEQ_LENGTH = 128


@pytest.mark.parametrize(
    ("adapter", "model_fixture", "dim", "output_shape"),
    [
        ("sentence_transformers", "tiny_model_dir", 32, [1, 32]),
        ("sentence_transformers_cross_encoder", "tiny_cross_encoder_dir", 0, [1]),
    ],
)
def test_probe_check_reports_measured_evidence_then_shutdown_unloads_and_exits_zero(
    spawn_child,  # type: ignore[no-untyped-def]
    request: pytest.FixtureRequest,
    adapter: str,
    model_fixture: str,
    dim: int,
    output_shape: list[int],
) -> None:
    model_directory = request.getfixturevalue(model_fixture)
    child = spawn_child(f"probe-{adapter}")
    child.send(_load(adapter, model_directory, f"probe-{adapter}", max_batch_size=5))
    answer = child.receive()
    assert answer is not None and answer.WhichOneof("kind") == "ready", child.stderr()
    ready = answer.ready
    assert ready.pid == child.process.pid
    assert ready.dim == dim
    assert ready.rss_bytes > 0
    assert ready.runtime_versions["device"] == "cpu"
    assert ready.runtime_versions["cuda_available"] == "not checked (device is cpu)"

    child.send(model_host_pb2.HostRequest(request_id=1, probe_check=model_host_pb2.ProbeCheck()))
    answer = child.receive()
    assert answer is not None and answer.request_id == 1
    assert answer.WhichOneof("kind") == "probe", answer
    probe = answer.probe

    health = probe.health
    assert health.process.status == wg.HEALTH_STATUS_OK
    assert health.runtime.status == wg.HEALTH_STATUS_OK
    assert health.model.status == wg.HEALTH_STATUS_OK, health.model.detail
    assert health.capability.status == wg.HEALTH_STATUS_NOT_CHECKED
    assert health.capability.detail == "NOT_ROUTED"
    assert list(probe.output_shape) == output_shape
    assert probe.output_finite
    assert probe.first_invoke_seconds > 0
    # The memory below is read after the profile's worst case: its batch size (5) of inputs,
    # each as long as the model takes (longer ones are cut to it).
    worst = probe.worst_case
    assert worst.ran, worst.detail
    assert (worst.batch_inputs, worst.input_tokens) == (5, TINY_MAX_SEQ_LENGTH), worst
    assert (worst.generated_tokens, worst.context_tokens) == (0, 0)
    assert worst.detail.startswith(f"5 inputs of {TINY_MAX_SEQ_LENGTH} tokens"), worst.detail

    memory = probe.memory
    assert memory.rss_current.source == "/proc/self/status VmRSS"
    assert memory.rss_peak.source == "/proc/self/status VmHWM"
    assert memory.rss_current.WhichOneof("value") == "bytes"
    assert memory.rss_peak.WhichOneof("value") == "bytes"
    assert memory.rss_peak.bytes >= memory.rss_current.bytes > 0
    for name in CUDA_FIELDS:
        reading = getattr(memory, name)
        assert reading.WhichOneof("value") == "unavailable", name
        assert reading.unavailable == "device is cpu", name
        assert reading.source.startswith("torch.cuda."), name
    for name in NVML_FIELDS:
        assert not memory.HasField(name), f"{name} is the worker's to measure"
    assert not memory.HasField("cuda_allocated_after_unload")  # only known after Shutdown

    offline = probe.offline
    # Observed by the child, not the adapter's declared settings (test_model_host_cuda_oom.py
    # shows each one changing when the child's state does): no code imported from outside its
    # interpreter's roots, and the weights it read mapped from its copy, never from elsewhere.
    assert offline.opens_observed is True
    assert list(offline.remote_code_modules) == []
    assert list(offline.weight_files) == ["model.safetensors"]
    assert list(offline.weight_files_outside_copy) == []
    assert offline.offline_env["HF_HUB_OFFLINE"] == "1"
    assert offline.offline_env["TRANSFORMERS_OFFLINE"] == "1"
    assert all(name.startswith(("HF_", "TRANSFORMERS_")) for name in offline.offline_env)
    assert offline.isolation == ready.isolation
    assert offline.isolation_reason == ready.isolation_reason
    assert offline.network_guard is True

    child.send(model_host_pb2.HostRequest(request_id=2, shutdown=model_host_pb2.Shutdown()))
    answer = child.receive()
    assert answer is not None and answer.request_id == 2
    assert answer.WhichOneof("kind") == "unloaded", answer
    after_unload = answer.unloaded.cuda_allocated_after_unload
    assert after_unload.WhichOneof("value") == "unavailable"
    assert after_unload.unavailable == "device is cpu"
    assert child.receive() is None  # nothing more: the child closed its end
    assert child.process.wait(timeout=30) == 0, child.stderr()


def test_unknown_adapter_is_runtime_incompatible_and_the_child_exits(
    spawn_child,  # type: ignore[no-untyped-def]
    tiny_model_dir: Path,
) -> None:
    child = spawn_child("probe-unknown-adapter")
    child.send(_load("llama_cpp", tiny_model_dir, "probe-unknown-adapter"))
    answer = child.receive()
    assert answer is not None and answer.WhichOneof("kind") == "failure", child.stderr()
    assert answer.failure.reason == "RUNTIME_INCOMPATIBLE"
    assert answer.failure.failure_class == common_pb2.FAILURE_CLASS_CONFIG
    assert "'llama_cpp'" in answer.failure.message
    assert "sentence_transformers, sentence_transformers_cross_encoder" in answer.failure.message
    assert child.process.wait(timeout=30) == EXIT_LOAD_FAILED


async def test_model_host_start_reports_an_unknown_adapter_as_runtime_incompatible(
    tiny_model_dir: Path,
) -> None:
    spec = HostLaunchSpec(
        deployment_id="dep-unknown-adapter",
        model_directory=tiny_model_dir,
        adapter=common_pb2.AdapterSettings(adapter="vllm", device="cpu"),
        python_executable=sys.executable,
        load_timeout_s=90,
    )
    with pytest.raises(GantryError) as caught:
        await ModelHost.start(spec)
    assert caught.value.reason == "RUNTIME_INCOMPATIBLE"
    assert caught.value.metadata["deployment_id"] == "dep-unknown-adapter"
