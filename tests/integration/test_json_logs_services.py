"""A service in a fresh interpreter logs JSON lines when GANTRY_LOG_FORMAT asks, text by default.

The formatter itself is tested in tests/unit/test_json_logs.py; this runs a process, which the unit
guard refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys


def run_setup_logging(env_value: str) -> subprocess.CompletedProcess[str]:
    script = (
        "import logging; from gantry.common.process import setup_logging;"
        "setup_logging('scheduler'); logging.getLogger('gantry.test').info('started')"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        env={"GANTRY_LOG_FORMAT": env_value, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_service_logs_json_lines_when_the_variable_asks_and_text_by_default() -> None:
    (line,) = run_setup_logging("json").stderr.splitlines()
    record = json.loads(line)
    assert (record["role"], record["logger"], record["message"]) == (
        "scheduler",
        "gantry.test",
        "started",
    )
    text = run_setup_logging("").stderr
    assert " scheduler INFO gantry.test: started" in text
    misspelt = run_setup_logging("yaml").stderr.splitlines()
    assert "GANTRY_LOG_FORMAT='yaml' is neither text nor json" in misspelt[0]
    assert misspelt[1].endswith("scheduler INFO gantry.test: started")
