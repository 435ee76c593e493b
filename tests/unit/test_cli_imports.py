"""The CLI stays light: role commands resolve their service lazily (no ML stack at import:
tests/integration/test_cli_imports_fresh_interpreter.py)."""

from __future__ import annotations

import pytest

from gantry.cli import main as cli_main
from gantry.cli.roles import run_role


def test_role_arguments_reach_the_service_untouched() -> None:
    argv = ["controlplane", "--listen", "127.0.0.1:1", "--help"]
    assert cli_main._role_invocation(argv) == ("controlplane", argv[1:])
    assert cli_main._role_invocation(["--state-dir", "x", "worker", "-v"]) == ("worker", ["-v"])
    assert cli_main._role_invocation(["--address=a:1", "scheduler"]) == ("scheduler", [])
    assert cli_main._role_invocation(["nodes", "worker"]) is None


def test_role_calls_the_service_main_with_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        received.append(argv)
        return 7

    monkeypatch.setattr("gantry.cli.roles._load_main", lambda role: fake_main)
    monkeypatch.setattr("setproctitle.setproctitle", lambda title: None)
    monkeypatch.delenv("GANTRY_SUPERVISOR_PID", raising=False)
    assert run_role("scheduler", ["--listen", "127.0.0.1:0"]) == 7
    assert received == [["--listen", "127.0.0.1:0"]]


def test_global_options_may_follow_the_command() -> None:
    args = cli_main.build_parser().parse_args(["nodes", "--address", "h:1", "--state-dir", "s"])
    assert (args.address, args.state_dir) == ("h:1", "s")
    args = cli_main.build_parser().parse_args(["--address", "h:2", "deployments"])
    assert args.address == "h:2"
    assert not hasattr(args, "state_dir")


def test_the_cli_imports_no_service_module_statically() -> None:
    """The CLI is its own distribution: it reaches the services only by name (gantry.cli.roles)."""
    import ast
    from pathlib import Path

    import gantry.cli

    services = ("gantry.controlplane", "gantry.scheduler", "gantry.worker")
    found: list[str] = []
    for source in sorted(Path(gantry.cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{source.name}: {name}" for name in names if name.startswith(services)]
    assert found == []


def test_a_missing_service_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from gantry.cli.errors import CliError
    from gantry.cli.roles import MIGRATE_MODULE, load_service_module

    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name="gantry.controlplane")

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(CliError, match=r"the controlplane service is not installed \(gantry\."):
        load_service_module("controlplane", MIGRATE_MODULE)
