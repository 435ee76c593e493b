"""`gantry deploy` sends the placement constraints it was given; a malformed one is a usage error
naming the flag (exit 2), never a request."""

from __future__ import annotations

import pytest

from gantry.cli.describe_render import constraints_text
from gantry.cli.main import build_parser
from gantry.v1 import common_pb2, control_plane_pb2
from tests.unit.test_cli_deploy_bounds import _deploy, sent  # noqa: F401  (the fixture)


def test_deploy_sends_every_constraint(
    sent: list[control_plane_pb2.CreateDeploymentRequest],  # noqa: F811
) -> None:
    flags = ["--gpu-model", "H100", "--min-compute-capability", "8.0", "--min-free-vram", "8GiB"]
    labels = ["--node-label", "zone=a", "--node-label", "rack=7"]
    assert _deploy(*flags, *labels) == 0
    [request] = sent
    assert request.constraints == common_pb2.PlacementConstraints(
        gpu_model="H100",
        min_compute_capability="8.0",
        min_free_vram_bytes=8 << 30,
        node_labels=["zone=a", "rack=7"],
    )


def test_deploy_without_constraints_sends_none(
    sent: list[control_plane_pb2.CreateDeploymentRequest],  # noqa: F811
) -> None:
    assert _deploy() == 0
    [request] = sent
    assert request.constraints == common_pb2.PlacementConstraints()


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--min-compute-capability", "eight", "'eight' is not major.minor"),
        ("--min-free-vram", "8 gigs", "'8 gigs' has an unknown unit 'gigs'"),
        ("--min-free-vram", "lots", "'lots' is not a size"),
        ("--node-label", "zone", "'zone' is not key=value"),
    ],
)
def test_a_malformed_constraint_is_a_usage_error(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["deploy", "appr-1", "--capability", "bge", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{flag}'" in err and said in err and "Traceback" not in err


def test_describe_says_what_a_deployment_was_aimed_at() -> None:
    assert constraints_text(common_pb2.PlacementConstraints()) == "-"
    aimed = common_pb2.PlacementConstraints(
        gpu_model="H100",
        min_compute_capability="8.0",
        min_free_vram_bytes=8 << 30,
        node_labels=["zone=a"],
    )
    assert constraints_text(aimed) == (
        "gpu model H100, compute capability >= 8.0, free VRAM >= 8.6 GB, label zone=a"
    )
