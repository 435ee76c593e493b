"""What every Gantry service process does at start: logging, and waiting for a stop signal."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import threading
from collections.abc import Mapping

from gantry.common.json_logs import JSON, LOG_FORMAT_ENV, LOG_FORMATS, json_handler, log_format_of

LOG_LEVEL_ENV = "GANTRY_LOG_LEVEL"

# `gantry worker`, from SIGTERM to its exit: every model host it started stopped and reaped
# within this (`gantry.worker.stop_plan` divides it). Declared once, here: what a supervisor
# gives the worker before SIGKILL (`gantry up`) is derived from it by `stop_grace_s`.
WORKER_STOP_BOUND_S = 10.0
# Past a child's own stop bound, before its supervisor kills it: the interpreter's exit after the
# bounded work, and a loaded machine's scheduling.
STOP_MARGIN_S = 5.0


def stop_grace_s(stop_bound_s: float) -> float:
    """How long a supervisor waits after SIGTERM for a child that stops within `stop_bound_s`:
    a grace no longer than the child's own bound would kill it before it could finish."""
    return stop_bound_s + STOP_MARGIN_S


def add_log_format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help=f"text, or json: one object per line with trace and span ids "
        f"(default: env {LOG_FORMAT_ENV}, else text)",
    )


def setup_logging(
    role: str, log_format: str | None = None, *, environ: Mapping[str, str] | None = None
) -> None:
    """Logging for a process: `--log-format`, else GANTRY_LOG_FORMAT, and GANTRY_LOG_LEVEL, read
    from `environ` (a service passes its settings' values) or else this process's environment."""
    env = os.environ if environ is None else environ
    chosen, warning = log_format_of(log_format, env)
    level = env.get(LOG_LEVEL_ENV, "INFO")
    if chosen == JSON:
        logging.basicConfig(level=level, handlers=[json_handler(role)])
    else:
        logging.basicConfig(
            level=level, format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"
        )
    if warning:
        logging.getLogger(__name__).warning("%s", warning)


def freeze_startup_heap() -> None:
    """Move what the process built to start out of the collector's sight.

    What a service built to start (its modules, settings, servers, database engine) lives as long
    as it does, so it is frozen (`gc.freeze`): a full collection then walks only what was made
    since, instead of pausing the event loop for all of it. Measured under `gantry up` (issue 29),
    4,000 Embeds one at a time: the control plane ran one full collection while serving, a 43 ms
    pause that was the run's slowest call (58 ms; 55-72 ms in eight such runs); frozen, it ran
    none, and the slowest call took 26-27 ms."""
    gc.collect()
    gc.freeze()


async def run_until_signalled() -> None:
    """Wait for SIGINT or SIGTERM, once the service is up (its start-up heap frozen first)."""
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def exit_even_if_threads_linger(code: int, *, after_s: float) -> threading.Timer:
    """End the process with `code` `after_s` from now unless it has exited by itself, naming in
    the log the threads that held it. Python's exit waits for every executor thread (asyncio.run
    joins its default executor's, the interpreter every ThreadPoolExecutor's), so one blocked in
    a call that never returns keeps a stopped service alive past its supervisor's grace: a worker
    that logged its stop once did not exit. The timer's thread is a daemon: a normal exit does
    not wait for it."""

    def force() -> None:
        held_by = sorted(
            t.name
            for t in threading.enumerate()
            if t not in (threading.current_thread(), threading.main_thread())
            and not t.daemon
            and t.is_alive()
        )
        logging.getLogger(__name__).error(
            "the process had not exited %gs after its stop, held by threads %s; exiting now",
            after_s,
            ", ".join(held_by) or "(none left)",
        )
        logging.shutdown()
        os._exit(code)

    timer = threading.Timer(after_s, force)
    timer.name = "exit-watchdog"
    timer.daemon = True
    timer.start()
    return timer
