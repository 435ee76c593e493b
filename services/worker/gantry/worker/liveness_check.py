"""`gantry worker --check`: exit 0 while this machine's worker heartbeat file is fresh, else 1.

The Kubernetes liveness probe of the worker, which listens on nothing. It reads one file: it needs
neither the node credential nor the control plane, and answers in one line, never a traceback.
Fresh means the worker's loop is ticking, connected or not: a worker reconnecting to an absent
control plane is live ("disconnected for N s, reconnecting"); only a stuck loop (a stale file) or
no file at all fails the probe.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gantry.common.arg_types import positive_seconds
from gantry.common.clock import Clock, SystemClock
from gantry.worker.heartbeat_file import (
    MISSED_BEATS_ALLOWED,
    default_heartbeat_file,
    judge_heartbeat,
    read_heartbeat,
)

CHECK_FLAG = "--check"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gantry worker --check",
        description="Exit 0 while the worker's heartbeat is fresh, 1 (with why) otherwise.",
    )
    parser.add_argument(CHECK_FLAG, action="store_true", required=True)
    parser.add_argument(
        "--heartbeat-file",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the worker's --heartbeat-file (default: {default_heartbeat_file()})",
    )
    parser.add_argument(
        "--max-age-s",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help=f"the oldest heartbeat that counts as live (default: {MISSED_BEATS_ALLOWED} "
        "heartbeat intervals, as the control plane's Welcome named them)",
    )
    return parser


def check(argv: Sequence[str], *, clock: Clock | None = None) -> int:
    args = _parser().parse_args(list(argv))
    path: Path = args.heartbeat_file or default_heartbeat_file()
    try:
        contents = read_heartbeat(path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(f"not live: heartbeat file {path} unreadable: {reason}", file=sys.stderr)
        return 1
    verdict = judge_heartbeat(
        contents, now=(clock or SystemClock()).now(), max_age_s=args.max_age_s
    )
    if not verdict.fresh:
        print(f"not live: {verdict.reason} ({path})", file=sys.stderr)
        return 1
    print(f"live: {verdict.reason}")
    return 0
