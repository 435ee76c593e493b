"""One build step of the Makefile, never silent: what it does before it starts, a line at least
every PROGRESS_EVERY_S seconds while it runs (the latest thing the command printed), and how long
it took. The command's whole output goes to a log file; on failure its tail is shown.

    python3 scripts/build_step.py "the default environment (.venv)" -- pip install ...

Standard library only: it runs before any environment of ours exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

# The bound is a line at least every 30 s; a step says something twice as often.
PROGRESS_EVERY_S = 15.0
LOG_DIR = Path("build/logs")
TAIL_ON_FAILURE = 40
# Lines that say nothing about progress: pip's notes about this machine's extra package folders.
_NOISE = re.compile(r"^WARNING: Location '.*' is ignored|^\s*$")
_WIDTH = 110


def _log_name(title: str) -> str:
    """The title's words before any parenthesis: "install .venv (...)" logs to install-.venv.log."""
    words = title.split(" (", 1)[0]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", words).strip("-").lower()[:60] or "step"


def _say(line: str) -> None:
    print(line, flush=True)


def run(title: str, argv: list[str]) -> int:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{_log_name(title)}.log"
    _say(f"==> {title}: started (log: {log_path})")
    started = time.monotonic()
    latest = [""]
    done = threading.Event()

    def progress() -> None:
        said = ""
        while not done.wait(PROGRESS_EVERY_S):
            line = latest[0]
            # The same line again means the command is busy without printing (pip installing
            # what it collected, a compiler on one file): say so rather than repeat it as news.
            shown = (f"still working after: {line}" if line == said else line) or "working"
            said = line
            _say(f"    {title}: {time.monotonic() - started:.0f} s  {shown[:_WIDTH]}")

    ticker = threading.Thread(target=progress, daemon=True)
    with log_path.open("w", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        ticker.start()
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if not _NOISE.match(line):
                latest[0] = line.strip()
        code = process.wait()
    done.set()
    ticker.join()
    took = time.monotonic() - started
    if code != 0:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        tail = [line for line in lines if not _NOISE.match(line)][-TAIL_ON_FAILURE:]
        _say("\n".join(f"    | {line}" for line in tail))
        _say(f"==> {title}: FAILED after {took:.0f} s (exit {code}); whole output: {log_path}")
        return code
    _say(f"==> {title}: done in {took:.0f} s")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: build_step.py TITLE -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(argv[0], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
