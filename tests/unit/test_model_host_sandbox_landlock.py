"""The sandbox's rules and levels (Landlock enforced in a real child process:
tests/integration/test_model_host_sandbox_landlock_enforced.py)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.worker.model_host import landlock, sandbox
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.sandbox import IsolationRequirement

FS = IsolationLevel.LANDLOCK_FS
FS_NET = IsolationLevel.LANDLOCK_FS_NET


@pytest.mark.parametrize(
    ("flag", "required"),
    [
        ("none", IsolationRequirement()),
        ("fs", IsolationRequirement(level=FS)),
        ("fs-net", IsolationRequirement(level=FS_NET)),
        ("fs-net-seccomp", IsolationRequirement(level=FS_NET, seccomp_net=True)),
        ("", IsolationRequirement()),
        ("LANDLOCK_FS_NET", IsolationRequirement(level=FS_NET)),
        ("LANDLOCK_FS_NET+SECCOMP_NET", IsolationRequirement(level=FS_NET, seccomp_net=True)),
        ("NONE+SECCOMP_NET", IsolationRequirement(seccomp_net=True)),
    ],
)
def test_flag_and_wire_spellings_parse_to_requirements(
    flag: str, required: IsolationRequirement
) -> None:
    assert sandbox.parse_required(flag) == required


@pytest.mark.parametrize("spelling", ["full", "SECCOMP_NET", "LANDLOCK_FS_NET+SECCOMP_NET+X"])
def test_an_unknown_level_is_an_error(spelling: str) -> None:
    with pytest.raises(ValueError, match="unknown isolation level"):
        sandbox.parse_required(spelling)


ISOLATIONS = [
    Isolation(level=level, seccomp_net=seccomp_net, reason="errno 38 ENOSYS")
    for level in IsolationLevel
    for seccomp_net in (False, True)
]


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=lambda isolation: isolation.wire)
def test_what_a_host_reports_reads_back_as_what_it_reached(isolation: Isolation) -> None:
    assert sandbox.reported_isolation(isolation.wire, isolation.reason) == isolation


def test_a_host_reporting_nothing_or_an_unknown_level_counts_as_unconfined() -> None:
    silent = sandbox.reported_isolation("", "")
    assert (silent.level, silent.seccomp_net) == (IsolationLevel.NONE, False)
    unknown = sandbox.reported_isolation("LANDLOCK_EVERYTHING", "trust me")
    assert (unknown.level, unknown.seccomp_net) == (IsolationLevel.NONE, False)
    assert "LANDLOCK_EVERYTHING" in unknown.reason


@pytest.mark.parametrize("flag", list(sandbox.REQUIRE_CHOICES))
@pytest.mark.parametrize("reached", ISOLATIONS, ids=lambda isolation: isolation.wire)
def test_a_host_below_the_requirement_is_refused_naming_both_and_the_reason(
    flag: str, reached: Isolation
) -> None:
    required = sandbox.REQUIRE_CHOICES[flag]
    refusal = sandbox.shortfall(required, reached)
    meets = reached.level >= required.level and (reached.seccomp_net or not required.seccomp_net)
    if meets:
        assert refusal is None
        return
    assert isinstance(refusal, GantryError)
    assert refusal.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert f"requires model host isolation {required.wire} " in refusal.message
    assert f"reached only {reached.wire}:" in refusal.message
    assert "errno 38 ENOSYS" in refusal.message
    assert refusal.metadata["isolation"] == reached.wire


def test_each_flag_is_met_by_every_host_that_meets_a_stronger_one() -> None:
    flags = list(sandbox.REQUIRE_CHOICES)
    for weaker, stronger in itertools.pairwise(flags):
        meeting_stronger = [i for i in ISOLATIONS if sandbox.REQUIRE_CHOICES[stronger].met_by(i)]
        assert meeting_stronger
        assert all(sandbox.REQUIRE_CHOICES[weaker].met_by(i) for i in meeting_stronger)


def test_a_seccomp_filtered_host_still_meets_the_requirements_that_predate_it() -> None:
    filtered = Isolation(level=FS_NET, seccomp_net=True, reason="")
    assert filtered.wire == "LANDLOCK_FS_NET+SECCOMP_NET"
    for flag in ("none", "fs", "fs-net", "fs-net-seccomp"):
        assert sandbox.shortfall(sandbox.REQUIRE_CHOICES[flag], filtered) is None
    assert sandbox.shortfall(
        sandbox.REQUIRE_CHOICES["fs-net-seccomp"], Isolation(level=FS_NET, reason="")
    )


def test_levels_are_ordered_weakest_first_and_named_as_on_the_wire() -> None:
    assert [level.name for level in sorted(IsolationLevel)] == [
        "NONE",
        "LANDLOCK_FS",
        "LANDLOCK_FS_NET",
    ]


@pytest.mark.parametrize(
    ("abi", "highest"),
    [
        (1, landlock.FS_MAKE_SYM),
        (2, landlock.FS_REFER),
        (3, landlock.FS_TRUNCATE),
        (4, landlock.FS_TRUNCATE),
        (5, landlock.FS_IOCTL_DEV),
        (7, landlock.FS_IOCTL_DEV),
    ],
)
def test_each_abi_handles_exactly_the_rights_it_knows(abi: int, highest: int) -> None:
    assert landlock.handled_fs_rights(abi) == highest * 2 - 1


def test_rules_grant_the_artifact_read_only_and_write_only_the_private_dir(tmp_path: Path) -> None:
    artifact, private = tmp_path / "artifact", tmp_path / "private"
    rules = sandbox.sandbox_rules(model_directory=artifact, private_dir=private, device="cpu")
    by_path = {rule.path: rule.access for rule in rules}

    assert by_path[artifact] == landlock.READ
    assert by_path[private] == landlock.READ_WRITE
    writers = {
        path
        for path, access in by_path.items()
        if access & (landlock.FS_WRITE_FILE | landlock.FS_MAKE_REG)
    }
    assert writers == {private, Path("/dev/null")}
    assert Path(sys.base_prefix) in by_path
    assert not any(str(path).startswith("/dev/nvidia") for path in by_path)
    assert Path("/") not in by_path
