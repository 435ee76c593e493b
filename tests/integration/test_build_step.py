"""scripts/build_step.py, as the Makefile runs it: it says what a step does before it starts, keeps
the whole output in a log, and ends with the time taken, or FAILED with the exit code and the
log's tail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEP = REPO / "scripts" / "build_step.py"


def _step(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STEP), "install x (about a minute)", "--", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_step_says_it_started_and_how_long_it_took_and_keeps_its_output(tmp_path: Path) -> None:
    done = _step(tmp_path, sys.executable, "-c", "print('Collecting torch')")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "==> install x (about a minute): started (log: build/logs/install-x.log)"
    assert lines[-1].startswith("==> install x (about a minute): done in ")
    assert (tmp_path / "build/logs/install-x.log").read_text() == "Collecting torch\n"


def test_a_failed_step_exits_with_its_code_and_shows_the_tail_of_its_output(
    tmp_path: Path,
) -> None:
    failed = _step(
        tmp_path, sys.executable, "-c", "import sys; print('ERROR: no matching wheel'); sys.exit(3)"
    )
    assert failed.returncode == 3
    assert "    | ERROR: no matching wheel" in failed.stdout
    assert failed.stdout.splitlines()[-1].startswith(
        "==> install x (about a minute): FAILED after "
    )
    assert "(exit 3); whole output: build/logs/install-x.log" in failed.stdout


def test_without_a_command_it_is_a_usage_error(tmp_path: Path) -> None:
    assert _step(tmp_path).returncode == 2
