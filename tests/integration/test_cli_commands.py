"""Operator and client commands against the in-memory fake control plane, over real gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.cli.main import main
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from tests.integration.test_cli_bootstrap import (
    CLIENT_KEY,
    OPERATOR_TOKEN,
    FakeControlPlane,
    FakeServer,
    running_fake,
    serve,
)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with running_fake() as server:
        yield server


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "operator.token").write_text(OPERATOR_TOKEN + "\n")
    (tmp_path / "client.key").write_text(CLIENT_KEY + "\n")
    (tmp_path / "artifacts").mkdir()
    return tmp_path


def gantry(fake: FakeServer, state: Path, *argv: str) -> int:
    return main(["--address", fake.address, "--state-dir", str(state), *argv])


def test_nodes_lists_every_page_as_a_table(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for index in range(3):
        fake.control_plane.nodes.append(
            control_plane_pb2.Node(
                node_id=f"n{index}",
                name=f"gpu-{index}",
                state=common_pb2.NODE_STATE_CONNECTED,
                generation=42 + index,
            )
        )
    assert gantry(fake, state, "nodes") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "GENERATION", "LAST", "SEEN"]
    assert lines[3].split() == ["n2", "gpu-2", "CONNECTED", "44", "never"]
    assert fake.control_plane.calls.count("ListNodes") == 2  # pages of two


def test_artifacts_register_then_list(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = state / "artifacts" / "team" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert gantry(fake, state, "artifacts", "register", str(model), "--name", "m") == 0
    captured = capsys.readouterr()
    assert "artifact_set_id  as-1" in captured.out
    assert f"manifest_digest  {'d' * 64}" in captured.out
    assert "100%" in captured.err
    assert fake.control_plane.artifact_sets[0].location == "team/model"

    assert gantry(fake, state, "artifacts", "list") == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:4] == ["as-1", "m", "team/model", "1"]


def test_artifacts_register_refuses_a_directory_outside_the_root(
    fake: FakeServer,
    state: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    assert gantry(fake, state, "artifacts", "register", str(outside)) == 1
    assert "is not under the artifact root" in capsys.readouterr().err
    assert "RegisterArtifactSet" not in fake.control_plane.calls


def test_every_gate_from_the_cli_then_deploy_deployments_and_unload(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gantry(fake, state, "assess", "as-9") == 0
    out = capsys.readouterr().out
    assert "state        COMPLETED" in out
    assert "adapters     sentence_transformers" in out

    assert gantry(fake, state, "profile", "asm-1", "--name", "bge-cpu", "--normalize") == 0
    out = capsys.readouterr().out
    assert "profile      prof-1" in out
    assert "sentence_transformers on cpu (normalize=true" in out
    speech = ("--adapter", "transformers_whisper", "--language", "en", "--task", "translate")
    assert gantry(fake, state, "profile", "asm-1", "--name", "whisper-cpu", *speech) == 0
    capsys.readouterr()
    sent = fake.control_plane.profiles[-1].adapter
    assert (sent.adapter, sent.language, sent.task) == ("transformers_whisper", "en", "translate")

    assert gantry(fake, state, "probe", "prof-1", "--wait-timeout", "30") == 0
    captured = capsys.readouterr()
    assert "probe probe-1: LOADING" in captured.err  # each stage is said while waiting
    assert "candidate    cand-probe-1 LAB_READY (production=false)" in captured.out

    assert gantry(fake, state, "probe", "show", "probe-1") == 0
    assert "state        COMPLETED" in capsys.readouterr().out

    assert gantry(fake, state, "approve", "cand-probe-1", "--reason", "reviewed") == 0
    assert "approval     appr-cand-probe-1" in capsys.readouterr().out

    # --no-wait: this fake never moves a deployment on (tests/integration/test_cli_deployments.py
    # waits against a real control plane).
    assert (
        gantry(fake, state, "deploy", "appr-cand-probe-1", "--capability", "bge", "--no-wait") == 0
    )
    assert capsys.readouterr().out.strip() == (
        "deployment dep-1 (bge, not bound yet: serves once it is READY): PENDING"
    )
    [created] = fake.control_plane.deployments
    assert created.adapter.adapter == "sentence_transformers"
    assert created.approval_id == "appr-cand-probe-1"
    created.residencies.add(node_id="node-7", state=common_pb2.RESIDENCY_STATE_RESIDENT)
    created.replicas = 1

    assert gantry(fake, state, "deployments") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        *("ID", "CAPABILITY", "STATE", "READY/WANTED", "NODE", "RESIDENCY"),
        *("WHY", "NOT", "ALL", "READY"),
    ]
    assert lines[1].split() == ["dep-1", "bge", "PENDING", "1/1", "node-7", "RESIDENT", "-"]

    assert gantry(fake, state, "unload", "dep-1", "--no-wait") == 0
    assert capsys.readouterr().out.strip() == "deployment dep-1: UNLOADING"


def test_deploy_without_an_approval_is_refused_with_the_reason(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gantry(fake, state, "deploy", "no-such-approval", "--capability", "bge") == 1
    assert "NOT_APPROVED" in capsys.readouterr().err
    assert fake.control_plane.deployments == []


def test_embed_prints_dim_and_leading_values_or_json(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gantry(fake, state, "embed", "hello", "world") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 vector(s), dim 4, deployment dep-1"
    assert lines[2] == "[1] 'world': [+0.1000, -0.5000, +0.2500, +0.3333]"

    assert gantry(fake, state, "embed", "hello", "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dim"] == 4
    assert document["vectors"] == [[0.0, -0.5, 0.25, 0.333333343]]


def test_profile_sends_the_preprocessing_flags_and_prints_what_was_bound(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        gantry(fake, state, "profile", "--help")
    usage = " ".join(capsys.readouterr().out.split())
    assert "transformers_trocr (text recognition in images)" in usage
    assert "transformers_siglip2 (image embeddings and classification)" in usage

    image = ("--adapter", "transformers_siglip2", "--image-size", "384")
    channels = ("--image-mean", "0.5,0.5,0.5", "--image-std", "0.26862954,0.26130258,0.27577711")
    assert gantry(fake, state, "profile", "asm-1", "--name", "siglip", *image, *channels) == 0
    sent = fake.control_plane.profiles[-1].adapter
    assert (sent.adapter, sent.image_size, list(sent.image_mean)) == (
        "transformers_siglip2",
        384,
        [0.5, 0.5, 0.5],
    )
    assert list(sent.image_std) == pytest.approx([0.26862954, 0.26130258, 0.27577711])
    assert sent.sampling_rate_hz == 0  # not given: the control plane fills it from inspection
    # The fake echoes the settings sent, as the server echoes what it bound.
    assert (
        "preprocess   image_size=384 image_mean=0.5,0.5,0.5 image_std=0.26863,0.261303,0.275777"
        in capsys.readouterr().out
    )

    speech = ("--adapter", "transformers_whisper", "--sampling-rate", "16000")
    assert gantry(fake, state, "profile", "asm-1", "--name", "whisper", *speech) == 0
    sent = fake.control_plane.profiles[-1].adapter
    assert (sent.sampling_rate_hz, sent.image_size, list(sent.image_mean)) == (16000, 0, [])
    assert "preprocess   sampling_rate=16000 Hz" in capsys.readouterr().out

    # Bad forms are refused before anything is sent.
    for flags in (("--image-mean", "0.5,x,0.5"), ("--image-std", "nan,1,1"), ("--image-size", "0")):
        with pytest.raises(SystemExit) as exited:
            gantry(fake, state, "profile", "asm-1", "--name", "bad", *flags)
        assert exited.value.code == 2
        assert flags[0] in capsys.readouterr().err
    assert len(fake.control_plane.profiles) == 2


class RecordingControlPlane(FakeControlPlane):
    """The CLI fake, also keeping the node and environment each assessment and probe asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, str]] = []

    def AssessCompatibility(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.asked.append(("assess", request.node_id, request.environment_id))
        return super().AssessCompatibility(request, context)

    def StartProbe(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.asked.append(("probe", request.node_id, ""))
        return super().StartProbe(request, context)


@contextmanager
def recording_fake() -> Iterator[FakeServer]:
    control_plane = RecordingControlPlane()
    server, port = serve("127.0.0.1:0", control_plane)
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        yield FakeServer(control_plane, address, control_plane_pb2_grpc.ControlPlaneStub(channel))
    server.stop(None)


def test_assess_and_probe_take_a_node_by_id_or_name_and_assess_an_environment(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_id = "0b6f3c55-5f7e-4d0c-9a51-2f1d6c3b8e11"
    with recording_fake() as fake:
        fake.control_plane.nodes.append(control_plane_pb2.Node(node_id=node_id, name="gpu-1"))
        vision = ("--environment", "vision", "--no-wait")
        assert gantry(fake, state, "assess", "as-1", "--node", "gpu-1", *vision) == 0
        assert gantry(fake, state, "assess", "as-1", "--node", node_id, "--no-wait") == 0
        assert gantry(fake, state, "assess", "as-1", "--no-wait") == 0
        assert gantry(fake, state, "probe", "prof-1", "--node", "gpu-1", "--no-wait") == 0
        assert gantry(fake, state, "assess", "as-1", "--node", "gpu-9", "--no-wait") == 1
        assert "no node has the id or name 'gpu-9'" in capsys.readouterr().err
        assert isinstance(fake.control_plane, RecordingControlPlane)
        assert fake.control_plane.asked == [
            ("assess", node_id, "vision"),
            ("assess", node_id, ""),
            ("assess", "", ""),
            ("probe", node_id, ""),
        ]
