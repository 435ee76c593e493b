"""The argparse-shaped declarations the CLI's modules make, as Click parses them.

Each case is one thing argparse did that Click has no word for, rebuilt in click_parser: a
subcommand's value over its group's, flags sharing a destination, an option with an optional
value, an option taking every word to the next option, exclusive groups, suppressed defaults,
and usage errors on one line with exit status 2.
"""

from __future__ import annotations

import argparse

import pytest

from gantry.cli.click_parser import CommandSpec


def _tree() -> CommandSpec:
    options = CommandSpec("gantry")
    options.add_argument("--address", default=argparse.SUPPRESS, help="HOST:PORT")
    root = CommandSpec("gantry", help_text="a test tree", parents=[options])
    commands = root.add_subparsers(title="commands", metavar="COMMAND")
    show = commands.add_parser("show", parents=[options], help="show one")
    show.set_defaults(handler="show")
    show.add_argument("-o", "--output", choices=("table", "json"), default="table")
    show.add_argument("--json", dest="output", action="store_const", const="json")
    show.add_argument("--watch", nargs="?", type=float, const=2.0, default=None)
    show.add_argument("--labels", nargs="+", action="extend", default=None)
    show.add_argument("files", nargs="*", metavar="FILE")
    target = show.add_mutually_exclusive_group(required=True)
    target.add_argument("--capability")
    target.add_argument("--deployment-id")
    return root


def test_a_global_option_is_taken_before_or_after_the_subcommand_and_after_wins() -> None:
    parse = _tree().parse_args
    assert parse(["--address", "a:1", "show", "--capability", "c"]).address == "a:1"
    assert parse(["show", "--capability", "c", "--address", "b:2"]).address == "b:2"
    both = parse(["--address", "a:1", "show", "--capability", "c", "--address", "b:2"])
    assert both.address == "b:2"
    assert not hasattr(parse(["show", "--capability", "c"]), "address")  # SUPPRESS: unset


def test_flags_sharing_a_destination_and_the_defaults() -> None:
    parse = _tree().parse_args
    plain = parse(["show", "--capability", "c"])
    assert (plain.handler, plain.output, plain.watch, plain.labels, plain.files) == (
        "show",
        "table",
        None,
        None,
        [],
    )
    assert parse(["show", "--capability", "c", "--json"]).output == "json"
    assert parse(["show", "--capability", "c", "-o", "json"]).output == "json"


def test_an_optional_value_and_a_greedy_option() -> None:
    parse = _tree().parse_args
    assert parse(["show", "--capability", "c", "--watch"]).watch == 2.0
    assert parse(["show", "--watch", "0.5", "--capability", "c"]).watch == 0.5
    greedy = parse(["show", "a.png", "--labels", "x y", "z", "--capability", "c", "b.png"])
    assert (greedy.labels, greedy.files) == (["x y", "z"], ["a.png", "b.png"])
    ended = parse(["show", "--capability", "c", "--labels", "x", "--", "a.png"])
    assert (ended.labels, ended.files) == (["x"], ["a.png"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show"], "one of the options --capability --deployment-id is required"),
        (
            ["show", "--capability", "c", "--deployment-id", "d"],
            "--deployment-id cannot be used with --capability",
        ),
        (["show", "--capability", "c", "-o", "xml"], "invalid choice: 'xml'"),
        (["show", "--capability", "c", "--watch", "soon"], "invalid float value: 'soon'"),
        (["nope"], "No such command 'nope'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _tree().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert err.startswith(f"gantry{' show' if argv[0] == 'show' else ''}: error: ")


def test_a_handlers_own_usage_error_names_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    show = _tree().subcommands["show"]
    with pytest.raises(SystemExit) as exited:
        show.error("give at least one FILE")
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "gantry show: error: give at least one FILE (see gantry show --help)\n"
    )


def test_help_lists_commands_in_declared_order_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _tree()
    root.add_subparsers().add_parser("alpha", help="declared last")
    with pytest.raises(SystemExit) as exited:
        root.parse_args(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert shown.index("show one") < shown.index("declared last")
