"""`gantry up` end to end with stand-in services: bootstrap, the banner, ordered shutdown."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gantry.cli.main import main
from tests.fixtures.migrated_copy import migrate_fresh
from tests.integration.polling import wait_until_sync
from tests.integration.test_cli_bootstrap import FAKE_WORKER_STOP_ENV
from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def start_up(
    state: Path,
    address: str,
    scheduler: str,
    role_argv: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    # `up` with its children swapped for stand-ins; everything else is the real command.
    driver = (
        "import sys\n"
        "import gantry.cli.up as up\n"
        f"up.role_argv = {role_argv}\n"
        "from gantry.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = ["--address", address, "--state-dir", str(state), "up", "--scheduler-address", scheduler]
    return subprocess.Popen(
        [sys.executable, "-c", driver, *argv, *extra],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def read_lines(stream: object) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str], text: str, *, timeout_s: float = 60.0) -> list[str]:
    """The lines read until one holds `text`: each wait is on the queue itself, for what is left
    of the deadline."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left_s)
        except queue.Empty:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never appeared; saw {seen}")


def wait_for_file_text(path: Path, text: str, *, timeout_s: float = 30.0) -> None:
    """Until another process has written `text` to `path`: a file offers nothing to wait on."""

    def content() -> str:
        return path.read_text() if path.exists() else ""

    wait_until_sync(
        lambda: text in content(),
        timeout_s,
        f"{text!r} in {path}",
        last=lambda: repr(content()[-2000:]),
    )


def stopped_lines(said: list[str]) -> list[tuple[str, int, str]]:
    """(name, pid, how) of each `gantry: stopped NAME (pid N): HOW` line, in order."""
    stops = []
    for line in said:
        if line.startswith("gantry: stopped "):
            head, _, how = line.strip().partition("): ")
            name, _, pid = head.removeprefix("gantry: stopped ").partition(" (pid ")
            stops.append((name, int(pid), how))
    return stops


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


FAKE_ROLES = (
    'lambda role, args: [sys.executable, "-m", "tests.integration.test_cli_bootstrap", role, *args]'
)


@pytest.mark.timeout(120)
def test_up_bootstraps_serves_and_stops_children_in_reverse_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    address = f"127.0.0.1:{free_port()}"
    process = start_up(state, address, f"127.0.0.1:{free_port()}", FAKE_ROLES)
    stdout, stderr = read_lines(process.stdout), read_lines(process.stderr)
    try:
        wait_for_line(stdout, "Ctrl-C stops everything.")
        # The real `gantry migrate` ran before the control plane started.
        migrated = wait_for_line(stderr, "is at schema revision")
        assert any("migrating the database" in line for line in migrated)
        assert (state / "gantry.db").is_file()
        for secret in ("operator.token", "scheduler.token", "node.credential", "client.key"):
            assert stat.S_IMODE((state / secret).stat().st_mode) == 0o600, secret
        assert (state / "artifacts" / "all-minilm-l6-v2" / "model.safetensors").exists()

        assert main(["--address", address, "--state-dir", str(state), "embed", "hi"]) == 0
        assert "1 vector(s), dim 4" in capsys.readouterr().out
        assert main(["--address", address, "--state-dir", str(state), "deployments"]) == 0
        assert "minilm      READY" in capsys.readouterr().out

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    said = wait_for_line(stderr, "stopped scheduler", timeout_s=10)
    stops = [line for line in said if line.startswith("gantry: stopped ")]
    assert [line.split()[2] for line in stops] == ["worker", "controlplane", "scheduler"]
    for line in stops:
        pid = int(line.split("(pid ")[1].split(")")[0])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "fake worker stopped" in (state / "logs" / "worker.log").read_text()


@pytest.mark.timeout(60)
def test_up_names_the_role_and_its_log_when_a_service_never_serves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # Migrated already (as a second `gantry up` finds it): the 5 s below is the scheduler's to
    # miss, not spent migrating a new database on a loaded machine.
    state.mkdir(mode=0o700)
    asyncio.run(migrate_fresh(f"sqlite+aiosqlite:///{state / 'gantry.db'}"))
    crashing = (
        "lambda role, args: [sys.executable, '-c',"
        " 'print(\"scheduler boom\"); raise SystemExit(2)']"
    )
    process = start_up(
        state,
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        crashing,
        "--startup-timeout",
        # Long enough for the first crash to be reported even on a loaded machine.
        "5",
    )
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "the scheduler did not report SERVING" in stderr
    assert str(state / "logs" / "scheduler.log") in stderr
    assert "scheduler boom" in stderr  # the log's last lines come with the error
    assert "restarting in 1s" in stderr
    assert "Traceback" not in stderr


@pytest.mark.timeout(120)
def test_a_second_signal_while_stopping_does_not_cut_the_ordered_stop_short(
    tmp_path: Path,
) -> None:
    # Ctrl-C under `make run` arrives twice: from the terminal, and from make passing it on.
    state, release = tmp_path / "state", tmp_path / "release-worker"
    process = start_up(
        state,
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        FAKE_ROLES,
        env={FAKE_WORKER_STOP_ENV: f"hold:{release}"},
    )
    stdout, stderr = read_lines(process.stdout), read_lines(process.stderr)
    said: list[str] = []
    try:
        wait_for_line(stdout, "Ctrl-C stops everything.")
        process.send_signal(signal.SIGTERM)
        wait_for_file_text(state / "logs" / "worker.log", "fake worker stopping, held")
        process.send_signal(signal.SIGINT)
        said += wait_for_line(stderr, "already stopping in order")
        release.touch()  # the worker may finish stopping now
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    said += wait_for_line(stderr, "stopped scheduler", timeout_s=10)
    stops = stopped_lines(said)
    assert [(name, how) for name, _, how in stops] == [
        ("worker", "exit code 0"),
        ("controlplane", "exit code 0"),
        ("scheduler", "exit code 0"),
    ]
    for _, pid, _ in stops:
        assert_gone(pid)
    assert "fake worker stopped" in (state / "logs" / "worker.log").read_text()


@pytest.mark.timeout(120)
def test_a_third_signal_kills_every_service_at_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    process = start_up(
        state,
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        FAKE_ROLES,
        env={FAKE_WORKER_STOP_ENV: "ignore"},
    )
    stdout, stderr = read_lines(process.stdout), read_lines(process.stderr)
    said: list[str] = []
    try:
        wait_for_line(stdout, "Ctrl-C stops everything.")
        process.send_signal(signal.SIGTERM)
        wait_for_file_text(state / "logs" / "worker.log", "fake worker ignores SIGTERM")
        process.send_signal(signal.SIGTERM)
        said += wait_for_line(stderr, "already stopping in order")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    said += wait_for_line(stderr, "stopped scheduler", timeout_s=10)
    assert any("killing every service now" in line for line in said)
    stops = stopped_lines(said)
    assert [(name, how) for name, _, how in stops] == [
        ("worker", "killed (forced)"),
        ("controlplane", "killed (forced)"),
        ("scheduler", "killed (forced)"),
    ]
    for _, pid, _ in stops:
        assert_gone(pid)


@pytest.mark.parametrize("http_address", ["127.0.0.1:8080", None])
def test_the_banner_names_every_front_door(tmp_path: Path, http_address: str | None):
    from gantry.cli.state import StatePaths
    from gantry.cli.up import UpSettings, banner

    settings = UpSettings(
        paths=StatePaths(root=tmp_path / ".gantry"),
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
        http_address=http_address,
    )
    lines = banner(settings, "d-1").splitlines()
    doors = {line.split()[0] + line.split()[1]: line for line in lines if line.startswith("  ")}
    assert "gantry.v1.Inference" in doors["controlplane"]
    assert "127.0.0.1:50051" in doors["KServev2"]
    assert "inference.GRPCInferenceService" in doors["KServev2"]
    if http_address:
        assert "http://127.0.0.1:8080/v1" in doors["OpenAIAPI"]
    else:
        assert "off (--no-http)" in doors["OpenAIAPI"]
