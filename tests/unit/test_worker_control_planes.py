"""`--control-plane` forms (control_planes.py): one address is one stream dialled as given, a list
one stream per entry, dns:///name:port one stream per address the name resolves to."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.worker.control_planes import (
    ControlPlanes,
    StreamTarget,
    parse_control_planes,
    plan_streams,
)
from gantry.worker.settings import read_settings


def test_one_address_is_one_stream_dialled_as_given_and_never_resolved():
    for text in ("127.0.0.1:50051", "controlplane:50051", "unix:/run/gantry.sock"):
        planes = parse_control_planes(text)
        assert not planes.resolves
        assert plan_streams(planes, {"controlplane": ("10.0.0.1", "10.0.0.2")}) == (
            StreamTarget(text),
        )


def test_a_list_is_one_stream_per_entry_in_its_order():
    planes = parse_control_planes(" cp-a:50051, cp-b:50052 ,[::1]:50053")
    assert plan_streams(planes, {}) == (
        StreamTarget("cp-a:50051"),
        StreamTarget("cp-b:50052"),
        StreamTarget("[::1]:50053"),
    )


@pytest.mark.parametrize(
    "text",
    ["cp-a:50051,", "cp-a:50051,cp-b", "cp-a:50051,dns:///cp:50051", "cp-a:1,cp-a:1", "dns:///cp"],
)
def test_a_malformed_list_or_name_is_refused(text: str):
    with pytest.raises(GantryError) as caught:
        parse_control_planes(text)
    assert caught.value.reason == "INVALID_ARGUMENT"


def test_a_dns_name_is_one_stream_per_resolved_address_named_by_the_name():
    planes = parse_control_planes("dns:///controlplane.gantry.svc:50051")
    assert planes == ControlPlanes(host="controlplane.gantry.svc", port=50051)
    resolved = {"controlplane.gantry.svc": ("10.0.0.7", "fd00::7", "10.0.0.7")}
    authority = "controlplane.gantry.svc:50051"
    assert plan_streams(planes, resolved) == (
        StreamTarget("10.0.0.7:50051", authority=authority),
        StreamTarget("[fd00::7]:50051", authority=authority),
    )
    assert plan_streams(planes, {}) == ()  # nothing resolved: the agent keeps what it holds


def test_the_dns_form_with_a_resolver_authority_is_read_too():
    planes = parse_control_planes("dns://8.8.8.8/cp.example:443")
    assert (planes.host, planes.port) == ("cp.example", 443)


def test_the_worker_command_refuses_a_bad_control_plane_before_it_connects(
    tmp_path, capsys: pytest.CaptureFixture[str]
):
    credential = tmp_path / "credential"
    credential.write_text("unused")
    argv = ["--credential-file", str(credential), "--artifact-root", str(tmp_path)]
    with pytest.raises(SystemExit) as exited:
        read_settings([*argv, "--control-plane", "cp-a:50051,cp-b"])
    assert exited.value.code == 2
    assert "--control-plane" in capsys.readouterr().err
    config, _ = read_settings(
        [*argv, "--control-plane", "dns:///cp:50051", "--control-plane-resolve-s", "5"]
    )
    assert config.worker_settings(None).resolve_interval_s == 5.0
