"""Which control-plane replicas a CLI command calls: --address, else $GANTRY_ADDRESS, else the
state directory's `control-planes` file (one address per line), else the default; a malformed
list is refused before any command runs, and `gantry up` listens on one address only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.cli.connection import ADDRESS_ENV, DEFAULT_ADDRESS, command_address
from gantry.cli.errors import CliError
from gantry.cli.main import build_parser, main
from gantry.cli.state import StatePaths
from gantry.common.errors import GantryError


@pytest.fixture
def state(tmp_path: Path) -> StatePaths:
    return StatePaths(tmp_path)


def test_the_flag_beats_the_variable_which_beats_the_file(state: StatePaths) -> None:
    state.control_planes.write_text("10.0.0.1:50051\n")
    env = {ADDRESS_ENV: "env-a:1,env-b:2"}
    assert command_address("flag:1", env, state) == "flag:1"
    assert command_address(None, env, state) == "env-a:1,env-b:2"
    assert command_address(None, {}, state) == "10.0.0.1:50051"
    assert command_address(None, {ADDRESS_ENV: ""}, state) == "10.0.0.1:50051"


def test_without_any_the_default_and_without_paths_the_file_is_not_read(
    state: StatePaths,
) -> None:
    assert command_address(None, {}, state) == DEFAULT_ADDRESS
    state.control_planes.write_text("10.0.0.1:50051\n")
    assert command_address(None, {}, None) == DEFAULT_ADDRESS


def test_the_file_lists_one_replica_a_line_with_blank_lines_and_comments(
    state: StatePaths,
) -> None:
    state.control_planes.write_text(
        "# written by gantry up --control-planes 3\n"
        "127.0.0.1:50051\n\n  127.0.0.1:50061  \n127.0.0.1:50071 # the third\n"
    )
    assert command_address(None, {}, state) == "127.0.0.1:50051,127.0.0.1:50061,127.0.0.1:50071"


@pytest.mark.parametrize(
    ("text", "says"),
    [("", "lists no control-plane address"), ("# only\n\n", "lists no"), ("a:1,b:2\n", "commas")],
)
def test_a_file_without_an_address_or_with_commas_is_refused(
    state: StatePaths, text: str, says: str
) -> None:
    state.control_planes.write_text(text)
    with pytest.raises(CliError, match=says) as raised:
        command_address(None, {}, state)
    assert str(state.control_planes) in str(raised.value)


def test_a_malformed_list_is_refused_with_a_typed_error(state: StatePaths) -> None:
    with pytest.raises(GantryError) as raised:
        command_address("a:1,,b:2", {}, state)
    assert raised.value.reason == "INVALID_ARGUMENT"


def test_a_command_with_a_malformed_list_exits_1_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--address", "a:1,", "--state-dir", str(tmp_path), "nodes"]) == 1
    assert "INVALID_ARGUMENT: an empty address in 'a:1,'" in capsys.readouterr().err


def test_gantry_up_refuses_a_list_and_ignores_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--address", "127.0.0.1:1,127.0.0.1:2", "--state-dir", str(tmp_path), "up"]
    assert main(argv) == 1
    assert "gantry up listens on one --address, not a list" in capsys.readouterr().err
    # Where up listens is never the replicas a client calls (main.py reads this default).
    assert build_parser().parse_args(["up"]).calls_control_planes is False
