"""`gantry up --control-planes 2 --database-url <fresh PostgreSQL>`, the real services and the
bundled model: two replicas and two schedulers come up, the banner and `<state>/control-planes`
name both replicas, each answers a ControlPlane read and the README's Embed, and the stop covers
every process in reverse order.

The plan of processes and ports is tested purely in tests/unit/test_cli_up_replicas.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from gantry.cli.connection import read_control_planes
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc, inference_pb2, inference_pb2_grpc
from tests.integration.test_cli_up import (
    assert_gone,
    read_lines,
    stopped_lines,
    wait_for_line,
)
from tests.ports import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_S = 400.0  # the bundled model's pipeline on a loaded CPU (inspect, probe, load)


def _address() -> str:
    return f"127.0.0.1:{free_port()}"


def _bearer(path: Path) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {path.read_text().strip()}"),)


def _replicas_in(banner: list[str]) -> list[str]:
    """The gRPC address of each `control plane` line of the banner."""
    return [line.split()[2] for line in banner if line.startswith("  control plane  ")]


def _read_and_embed(address: str, state: Path) -> list[float]:
    """A ControlPlane read (this node is listed) and the README's Embed, on one replica."""
    with grpc.insecure_channel(address) as channel:
        nodes = control_plane_pb2_grpc.ControlPlaneStub(channel).ListNodes(
            control_plane_pb2.ListNodesRequest(),
            metadata=_bearer(state / "operator.token"),
            timeout=30,
        )
        assert len(nodes.nodes) == 1, nodes
        answer = inference_pb2_grpc.InferenceStub(channel).Embed(
            inference_pb2.EmbedRequest(
                capability="minilm", inputs=["Gantry keeps models resident."]
            ),
            metadata=_bearer(state / "client.key"),
            timeout=60,
        )
    [vector] = answer.vectors
    return list(vector.values)


@pytest.mark.timeout(600)
def test_up_runs_two_replicas_on_postgresql_and_both_serve(
    postgres_url: str, tmp_path: Path
) -> None:
    state = tmp_path / ".gantry"
    first = _address()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "gantry.cli.main", "--state-dir", str(state), "--address", first,
            "up", "--scheduler-address", _address(), "--http-address", _address(),
            "--no-metrics", "--control-planes", "2", "--database-url", postgres_url,
            "--ready-timeout", str(READY_S),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        start_new_session=True,  # its own group: the teardown ends everything it started
    )  # fmt: skip
    stdout, stderr = read_lines(process.stdout), read_lines(process.stderr)
    said: list[str] = []
    try:
        banner = wait_for_line(stdout, "Ctrl-C stops everything.", timeout_s=READY_S + 60)
        replicas = _replicas_in(banner)
        assert len(replicas) == 2 and replicas[0] == first, banner
        assert sum("OpenAI API     http://" in line for line in banner) == 2, banner
        assert read_control_planes(state / "control-planes") == ",".join(replicas)
        vectors = [_read_and_embed(address, state) for address in replicas]
        assert len(vectors[0]) == 384 and vectors[0] == pytest.approx(vectors[1], abs=1e-5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    said += wait_for_line(stderr, "stopped scheduler ", timeout_s=10)
    stops = stopped_lines(said)
    assert [name for name, _, _ in stops] == [
        "worker",
        "controlplane-2",
        "controlplane",
        "scheduler-2",
        "scheduler",
    ]
    for _, pid, _ in stops:
        assert_gone(pid)
