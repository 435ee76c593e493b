"""`gantry up --device cuda:1` creates the bundled model's profile on that device, against the
in-memory control plane of test_cli_bootstrap over real gRPC.

How the device is chosen is tested in tests/unit/test_cli_up_device.py; this serves gRPC on a
port, which the unit guard refuses. On a node without CUDA, the real `gantry up --device cuda`
refuses in one line once its worker reports its default environment, and stops what it started.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gantry.cli import bootstrap
from gantry.worker.nvml_readings import Nvml
from tests.integration.test_cli_bootstrap import (  # noqa: F401  (fixtures)
    METADATA,
    FakeServer,
    fake,
    make_paths,
    model_dir,
)


def test_the_profile_is_created_on_the_chosen_device(
    fake: FakeServer,  # noqa: F811
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    paths = make_paths(tmp_path)
    bootstrap.ensure_deployment(
        fake.stub, METADATA, paths, model_dir, lambda line: None, device="cuda:1"
    )
    [profile] = fake.control_plane.profiles
    assert (profile.name, profile.adapter.device) == ("all-minilm-l6-v2-cuda1", "cuda:1")


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.timeout(180)
def test_up_asked_for_cuda_on_a_node_without_it_refuses_in_one_line_and_stops(
    tmp_path: Path,
) -> None:
    nvml = Nvml.open()
    has_nvml = nvml.available
    nvml.close()
    if has_nvml:
        pytest.skip("NVML works on this node: its worker may well report CUDA")
    state = tmp_path / "state"
    done = subprocess.run(
        [
            sys.executable, "-m", "gantry.cli.main", "--state-dir", str(state),
            "--address", _free_address(), "up", "--scheduler-address", _free_address(),
            "--no-metrics", "--no-http", "--device", "cuda",
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == (
        "error: --device cuda: the worker's default environment reports device 'cpu', not CUDA;"
        " `--device cpu` (or auto) profiles the bundled model on the CPU"
    )
    assert "Traceback" not in done.stderr
    for role in ("worker", "controlplane", "scheduler"):  # each stopped, none left running
        assert any(line.startswith(f"gantry: stopped {role} (pid ") for line in lines), role
    assert not (state / "artifacts" / bootstrap.MODEL_NAME).exists()  # nothing profiled
