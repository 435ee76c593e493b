"""The sandbox's rules and levels, and Landlock's syscalls in a real (throwaway) child process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.worker.model_host import landlock, sandbox
from gantry.worker.model_host.landlock import Isolation, IsolationLevel


@pytest.mark.parametrize(
    ("flag", "level"),
    [
        ("none", IsolationLevel.NONE),
        ("fs", IsolationLevel.LANDLOCK_FS),
        ("fs-net", IsolationLevel.LANDLOCK_FS_NET),
        ("", IsolationLevel.NONE),
        ("LANDLOCK_FS_NET", IsolationLevel.LANDLOCK_FS_NET),
    ],
)
def test_flag_and_wire_spellings_parse_to_levels(flag: str, level: IsolationLevel) -> None:
    assert sandbox.parse_required(flag) is level


def test_an_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown isolation level"):
        sandbox.parse_required("full")


@pytest.mark.parametrize("required", list(IsolationLevel))
@pytest.mark.parametrize("reached", list(IsolationLevel))
def test_a_host_below_the_requirement_is_refused_naming_both_and_the_reason(
    required: IsolationLevel, reached: IsolationLevel
) -> None:
    refusal = sandbox.shortfall(required, Isolation(level=reached, reason="errno 38 ENOSYS"))
    if reached >= required:
        assert refusal is None
        return
    assert isinstance(refusal, GantryError)
    assert refusal.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert required.name in refusal.message and reached.name in refusal.message
    assert "errno 38 ENOSYS" in refusal.message


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


_RESTRICT_AND_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from gantry.worker.model_host import landlock, sandbox
    allowed, denied, private = (Path(p) for p in sys.argv[1:4])
    isolation = sandbox.enter(model_directory=allowed, private_dir=private, device="cpu")
    def attempt(action):
        try:
            action()
            return "allowed"
        except OSError as exc:
            return f"denied {exc.errno}"
    print(json.dumps({
        "level": isolation.level.name,
        "reason": isolation.reason,
        "read_allowed": attempt(lambda: (allowed / "config.json").read_text()),
        "write_allowed_dir": attempt(lambda: (allowed / "new").write_text("x")),
        "read_denied": attempt(lambda: denied.read_text()),
        "write_private": attempt(lambda: (private / "scratch").write_text("x")),
    }))
    """
)


def test_a_restricted_process_reads_only_what_its_rules_grant(tmp_path: Path) -> None:
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable as exc:
        pytest.skip(f"this kernel refuses Landlock: {exc}")
    allowed, private = tmp_path / "artifact", tmp_path / "private"
    allowed.mkdir()
    private.mkdir()
    (allowed / "config.json").write_text("{}")
    denied = tmp_path / "secret"
    denied.write_text("s3cret")
    completed = subprocess.run(
        [sys.executable, "-I", "-c", _RESTRICT_AND_PROBE, str(allowed), str(denied), str(private)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(completed.stdout)
    assert outcome["level"] != "NONE", outcome["reason"]
    assert outcome["read_allowed"] == "allowed"
    assert outcome["write_allowed_dir"] == "denied 13"
    assert outcome["read_denied"] == "denied 13"
    assert outcome["write_private"] == "allowed"
