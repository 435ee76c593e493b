"""Operator and client commands against the in-memory fake control plane, over real gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.cli.main import main
from gantry.v1 import common_pb2, control_plane_pb2
from tests.unit.test_cli_bootstrap import CLIENT_KEY, OPERATOR_TOKEN, FakeServer, running_fake


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

    assert gantry(fake, state, "deployments") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "CAPABILITY", "STATE", "NODE", "RESIDENCY"]
    assert lines[1].split() == ["dep-1", "bge", "PENDING", "node-7", "RESIDENT"]

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
