"""`gantry deploy` sends the autoscale bounds and the placement policy it was given."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from gantry.cli import operator_commands
from gantry.cli.main import build_parser
from gantry.v1 import common_pb2, control_plane_pb2


class _Context:
    """What `deploy` needs of a CommandContext: metadata and a channel (never opened here)."""

    def operator_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer test"),)

    @contextlib.contextmanager
    def open_channel(self) -> Iterator[object]:
        yield object()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[control_plane_pb2.CreateDeploymentRequest]:
    requests: list[control_plane_pb2.CreateDeploymentRequest] = []

    class _Stub:
        def __init__(self, channel: object) -> None:
            pass

        def CreateDeployment(self, request: Any, **_: Any) -> control_plane_pb2.Deployment:
            requests.append(request)
            return control_plane_pb2.Deployment(deployment_id="dep-1", capability="bge")

    monkeypatch.setattr(operator_commands.control_plane_pb2_grpc, "ControlPlaneStub", _Stub)
    return requests


def _deploy(*flags: str) -> int:
    # --no-wait: only the request is under test here (the stub answers nothing more).
    args = build_parser().parse_args(
        ["deploy", "appr-1", "--capability", "bge", "--no-wait", *flags]
    )
    return operator_commands.deploy(_Context(), args)  # type: ignore[arg-type]


def test_deploy_sends_bounds_and_spread_placement(
    sent: list[control_plane_pb2.CreateDeploymentRequest],
):
    assert _deploy("--min-replicas", "1", "--max-replicas", "4", "--placement", "spread") == 0
    [request] = sent
    assert (request.replicas, request.min_replicas, request.max_replicas) == (1, 1, 4)
    assert request.placement_policy == common_pb2.PLACEMENT_POLICY_SPREAD


def test_deploy_without_flags_asks_for_bin_pack_and_no_autoscale(
    sent: list[control_plane_pb2.CreateDeploymentRequest],
):
    assert _deploy() == 0
    [request] = sent
    assert (request.min_replicas, request.max_replicas) == (0, 0)  # the server reads "= replicas"
    assert request.placement_policy == common_pb2.PLACEMENT_POLICY_BIN_PACK


def test_an_unknown_placement_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["deploy", "a", "--capability", "b", "--placement", "random"])


@pytest.mark.parametrize("flag", ["--replicas", "--min-replicas", "--max-replicas"])
def test_a_negative_count_is_a_usage_error_not_a_traceback(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["deploy", "appr-1", "--capability", "bge", flag, "-1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{flag}': -1 is negative" in err and "Traceback" not in err


def test_gantry_version_names_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"gantry {importlib.metadata.version('gantry-cli')}\n"
