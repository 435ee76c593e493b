"""`--wait`'s rule: when a deployment has settled, failed, or still waits (and for what), and the
progress line it says; the poll loop with a fake stub and clock; `gantry delete KIND ID`."""

from __future__ import annotations

from typing import Any

import pytest

from gantry.cli import delete_commands
from gantry.cli.deployment_wait import Goal, observe, wait_for_deployment
from gantry.cli.errors import CliError
from gantry.cli.main import build_parser
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp

RESIDENT, LOADING, COLD = (
    common_pb2.RESIDENCY_STATE_RESIDENT,
    common_pb2.RESIDENCY_STATE_LOADING,
    common_pb2.RESIDENCY_STATE_COLD,
)


def deployment(state: int, *residencies: tuple[str, int], replicas: int = 2) -> cp.Deployment:
    return cp.Deployment(
        deployment_id="d-1",
        state=state,  # type: ignore[arg-type]
        replicas=replicas,
        residencies=[common_pb2.Residency(node_id=n, state=s) for n, s in residencies],  # type: ignore[arg-type]
    )


def test_loading_is_said_with_each_residency_and_what_is_still_missing() -> None:
    seen = observe(deployment(cp.DEPLOYMENT_STATE_LOADING, ("n-a", LOADING)), Goal.READY)
    assert seen.line == "deployment d-1 LOADING: 0/2 resident (n-a LOADING)"
    assert not seen.settled and not seen.failure
    assert seen.waiting_for == "READY with 2 RESIDENT replica(s) (0 so far)"


def test_ready_settles_only_with_the_wanted_replicas_resident_and_no_surplus() -> None:
    one = deployment(cp.DEPLOYMENT_STATE_READY, ("n-a", RESIDENT), ("n-b", LOADING))
    assert not observe(one, Goal.READY).settled
    both = deployment(
        cp.DEPLOYMENT_STATE_READY, ("n-a", RESIDENT), ("n-b", RESIDENT), ("n-c", COLD)
    )
    assert observe(both, Goal.READY).settled
    draining = deployment(
        cp.DEPLOYMENT_STATE_READY,
        ("n-a", RESIDENT),
        ("n-b", common_pb2.RESIDENCY_STATE_UNLOADING),
        replicas=1,
    )
    assert not observe(draining, Goal.READY).settled  # a scale down settles once drained


def test_failed_gives_the_reason_and_message_and_a_retried_failure_is_only_said() -> None:
    failed = deployment(cp.DEPLOYMENT_STATE_FAILED, ("n-a", COLD))
    failed.last_failure.CopyFrom(common_pb2.Failure(reason="LOAD_FAILED", message="no GPU"))
    assert observe(failed, Goal.READY).failure == "LOAD_FAILED: no GPU"
    pending = deployment(cp.DEPLOYMENT_STATE_PENDING)
    pending.last_failure.CopyFrom(common_pb2.Failure(reason="NO_CAPACITY", message="full"))
    seen = observe(pending, Goal.READY)
    assert not seen.failure and seen.line.endswith("; last failure NO_CAPACITY: full")


def test_unloaded_goal() -> None:
    assert observe(deployment(cp.DEPLOYMENT_STATE_UNLOADED), Goal.UNLOADED).settled
    seen = observe(
        deployment(cp.DEPLOYMENT_STATE_UNLOADING, ("n-a", common_pb2.RESIDENCY_STATE_UNLOADING)),
        Goal.UNLOADED,
    )
    assert seen.line == "deployment d-1 UNLOADING: 1 residency(ies) still loaded (n-a UNLOADING)"
    assert not seen.settled and seen.waiting_for == "UNLOADED"
    assert observe(deployment(cp.DEPLOYMENT_STATE_READY), Goal.READY).failure == ""
    assert (
        "unloaded meanwhile"
        in observe(deployment(cp.DEPLOYMENT_STATE_UNLOADED), Goal.READY).failure
    )


class _Stub:
    def __init__(self, answers: list[cp.Deployment]) -> None:
        self.answers = answers

    def GetDeployment(self, request: Any, **_: Any) -> cp.Deployment:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_the_poll_says_each_change_once_and_times_out_saying_what_it_waits_for() -> None:
    now = [0.0]
    said: list[str] = []
    stub = _Stub(
        [
            deployment(cp.DEPLOYMENT_STATE_PENDING),
            deployment(cp.DEPLOYMENT_STATE_PENDING),
            deployment(cp.DEPLOYMENT_STATE_LOADING, ("n-a", LOADING)),
        ]
    )
    with pytest.raises(CliError) as caught:
        wait_for_deployment(
            stub,  # type: ignore[arg-type]
            (),
            "d-1",
            goal=Goal.READY,
            timeout_s=3.0,
            say=said.append,
            clock=lambda: now[0],
            sleep=lambda seconds: now.__setitem__(0, now[0] + 1.0),
        )
    assert str(caught.value) == (
        "deployment d-1 is still LOADING after 3s; waiting for READY with 2 RESIDENT replica(s)"
        " (0 so far)"
    )
    assert said == [
        "deployment d-1 PENDING: 0/2 resident (0s)",
        "deployment d-1 LOADING: 0/2 resident (n-a LOADING) (2s)",
    ]


def test_delete_takes_a_kind_and_an_id_and_a_kind_is_registered_once() -> None:
    args = build_parser().parse_args(["delete", "deployment", "d-1", "-o", "json"])
    assert args.object_id == "d-1" and args.output == "json"
    assert args.handler is delete_commands.DELETE_KINDS["deployment"].handler
    with pytest.raises(ValueError):
        delete_commands.add_delete_kind("deployment", args.handler, "again")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["scale", "d-1", "--replicas", "-1"])  # a usage error
