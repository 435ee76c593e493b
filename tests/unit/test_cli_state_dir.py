"""Which state directory a command uses (flag, environment, walking up, default), and the
`gantry up` examples spelling out a non-default address and state directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.cli.errors import CliError
from gantry.cli.state import StatePaths, locate_state_dir, read_secret
from gantry.cli.up import UpSettings, cli_prefix


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "project" / ".gantry").mkdir(parents=True)
    (tmp_path / "project" / "src" / "deep").mkdir(parents=True)
    return tmp_path / "project"


def test_the_flag_wins_then_the_environment_then_the_nearest_project_then_the_default(
    project: Path, tmp_path: Path
):
    deep = project / "src" / "deep"
    env = {"GANTRY_STATE_DIR": "/from/env"}
    flagged = locate_state_dir(flag="/from/flag", env=env, cwd=deep)
    assert (flagged.root, flagged.origin) == (Path("/from/flag"), "given by --state-dir")
    from_env = locate_state_dir(flag=None, env=env, cwd=deep)
    assert (from_env.root, from_env.origin) == (Path("/from/env"), "given by $GANTRY_STATE_DIR")
    walked = locate_state_dir(flag=None, env={}, cwd=deep)
    assert walked.root == project / ".gantry"
    assert walked.origin == f"found walking up from {deep}"
    here = locate_state_dir(flag=None, env={}, cwd=project)
    assert (here.root, here.origin) == (project / ".gantry", "found in the working directory")
    (deep / ".gantry").mkdir()
    assert locate_state_dir(flag=None, env={}, cwd=deep).root == deep / ".gantry"  # the nearest


def test_up_does_not_adopt_a_parent_projects_state(project: Path):
    chosen = locate_state_dir(flag=None, env={}, cwd=project / "src", walk_up=False)
    assert chosen.root == Path(".gantry")


def test_a_missing_secret_names_the_directory_and_how_it_was_chosen(tmp_path: Path):
    paths = StatePaths(tmp_path / "state", origin="given by $GANTRY_STATE_DIR")
    with pytest.raises(CliError) as raised:
        read_secret(paths.operator_token, what="operator token", state=paths)
    message = str(raised.value)
    assert f"state directory {tmp_path / 'state'} (given by $GANTRY_STATE_DIR)" in message
    assert "--state-dir DIR or GANTRY_STATE_DIR=DIR" in message


def _settings(paths: StatePaths, address: str) -> UpSettings:
    return UpSettings(
        paths=paths,
        address=address,
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
    )


def test_the_printed_examples_name_a_non_default_address_and_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    plain = cli_prefix(_settings(StatePaths(Path(".gantry")), "127.0.0.1:50051"))
    assert "--address" not in plain and "--state-dir" not in plain
    named = cli_prefix(_settings(StatePaths(tmp_path / "other"), "127.0.0.1:6000"))
    assert named.endswith(" --address 127.0.0.1:6000 --state-dir other")
