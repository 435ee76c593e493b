"""The isolation a host reached travels into the inventory; the worker's requirement to the host."""

from __future__ import annotations

from pathlib import Path

from gantry.common.clock import ManualClock
from gantry.v1 import common_pb2, model_host_pb2
from gantry.worker.agent import WorkerSettings
from gantry.worker.crash_policy import CrashHistory, RestartPolicy
from gantry.worker.model_host.process import HostLaunchSpec
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.residents import RESIDENT, Resident, ResidentFacts

FACTS = ResidentFacts(
    artifact_digest="sha256:a",
    environment_id="default",
    adapter_digest="d",
    environment_fingerprint="f",
)


class SandboxedHost:
    pid = 4242
    returncode = None
    unresponsive = None
    alive = True
    ready = model_host_pb2.HostReady(
        pid=4242,
        dim=8,
        isolation="LANDLOCK_FS_NET+SECCOMP_NET",
        isolation_reason="Landlock ABI 7: filesystem allow-list, TCP bind and connect denied; "
        "seccomp: sockets other than AF_UNIX and AF_NETLINK denied (UDP included)",
    )

    def rss_bytes(self) -> int:
        return 1024


def _resident() -> Resident:
    return Resident(
        deployment_id="dep-1",
        facts=FACTS,
        crashes=CrashHistory(RestartPolicy(), ManualClock()),
        state=RESIDENT,
    )


def test_the_inventory_reports_the_current_hosts_isolation_and_why() -> None:
    resident = _resident()
    resident.host = SandboxedHost()  # type: ignore[assignment]

    reported = resident.to_proto()

    assert reported.isolation == "LANDLOCK_FS_NET+SECCOMP_NET"
    assert reported.isolation_reason.startswith("Landlock ABI 7")


def test_a_resident_without_a_host_reports_no_isolation() -> None:
    reported = _resident().to_proto()
    assert (reported.isolation, reported.isolation_reason) == ("", "")


def test_workers_require_nothing_unless_told_and_hosts_inherit_that() -> None:
    settings = WorkerSettings(control_plane="", credential="", artifact_root=Path())
    assert settings.require_isolation == IsolationRequirement()
    spec = HostLaunchSpec(
        deployment_id="d",
        model_directory=Path("/m"),
        adapter=common_pb2.AdapterSettings(),
        python_executable="/usr/bin/python3",
    )
    assert spec.require_isolation == IsolationRequirement()
    assert spec.require_isolation.wire == "NONE"
