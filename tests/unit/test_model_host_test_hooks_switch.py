"""The test hooks' switch reaches a host only when a test asks for it (issue 26, item 9): a
worker's own environment cannot pass it on, so no production host receives or honours it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.worker.model_host.environments import (
    INHERITED_ENVIRONMENT,
    TEST_HOOKS_VARIABLE,
    host_environment,
)
from gantry.worker.model_host.process import HostLaunchSpec

PRIVATE = Path("/tmp/gantry-host-x")


def _host(worker_environment: dict[str, str], *, test_hooks: bool = False) -> dict[str, str]:
    return host_environment(
        worker_environment,
        private_dir=PRIVATE,
        scratch_dir=PRIVATE / "tmp",
        test_hooks=test_hooks,
    )


@pytest.mark.parametrize("value", ["1", "0", "yes"])
def test_a_worker_environment_that_sets_the_switch_does_not_pass_it_to_its_hosts(
    value: str,
) -> None:
    assert TEST_HOOKS_VARIABLE not in INHERITED_ENVIRONMENT
    assert TEST_HOOKS_VARIABLE not in _host({TEST_HOOKS_VARIABLE: value, "LANG": "C.UTF-8"})


def test_only_a_host_started_for_a_test_gets_the_switch_on() -> None:
    assert _host({}, test_hooks=True)[TEST_HOOKS_VARIABLE] == "1"
    # An explicit "0" from the worker does not turn a test's hooks off either: one source only.
    assert _host({TEST_HOOKS_VARIABLE: "0"}, test_hooks=True)[TEST_HOOKS_VARIABLE] == "1"


def test_the_launch_spec_a_worker_builds_has_the_hooks_off() -> None:
    spec = HostLaunchSpec(
        deployment_id="d",
        model_directory=PRIVATE,
        adapter=None,  # type: ignore[arg-type]
        python_executable="/usr/bin/python3",
        env={TEST_HOOKS_VARIABLE: "1"},  # overrides still go through the allow-list
    )
    assert spec.test_hooks is False
