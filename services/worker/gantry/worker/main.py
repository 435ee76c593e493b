"""`gantry worker`: connect out to the control plane and serve until SIGINT/SIGTERM.

Its flags and configuration variables are read and checked in `settings.py`; this module only
starts what they describe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from gantry.common import event_loop
from gantry.common.errors import GantryError
from gantry.common.metrics import start_metrics
from gantry.common.process import (
    WORKER_STOP_BOUND_S,
    exit_even_if_threads_linger,
    run_until_signalled,
    setup_logging,
)
from gantry.common.telemetry import setup_tracing
from gantry.common.verified_roots import sweep_abandoned_verified_roots
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.liveness_check import CHECK_FLAG, check
from gantry.worker.settings import read_settings
from gantry.worker.stop_plan import StopPlan

log = logging.getLogger(__name__)


def reclaim_abandoned_verified_copies() -> None:
    """Delete the verified copies of workers that died without removing them (SIGKILL, OOM)."""
    try:
        sweep = sweep_abandoned_verified_roots()
    except (OSError, GantryError) as exc:
        log.warning("could not sweep abandoned verified artifact copies: %s", exc)
        return
    log.info(
        "reclaimed %d verified-copy directories (%d bytes) abandoned by dead workers; "
        "%d belong to live processes",
        sweep.directories_removed,
        sweep.bytes_removed,
        sweep.directories_kept,
    )
    for failure in sweep.failures:
        log.warning("could not reclaim an abandoned verified-copy directory: %s", failure)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if CHECK_FLAG in argv:
        # The liveness probe: reads the heartbeat file only (no credential, no connection).
        return check(argv)
    config, declared = read_settings(argv)
    setup_logging("worker", config.log_format, environ=config.logging_environment())
    setup_tracing("gantry-worker")
    if not start_metrics("gantry-worker", config.metrics_address):
        return 2
    reclaim_abandoned_verified_copies()
    return event_loop.run(_serve(config.worker_settings(declared)))


async def _serve(settings: WorkerSettings) -> int:
    agent = WorkerAgent(settings)
    log.info("worker generation %d", agent.generation)
    runner = asyncio.create_task(agent.run())
    stopper = asyncio.create_task(run_until_signalled())
    done, _ = await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    # The bound starts now, at the signal: its supervisor's grace (`gantry up`) is derived
    # from it, so every step below shares these deadlines instead of taking its own.
    loop = asyncio.get_running_loop()
    plan = StopPlan.starting(loop.time())
    log.info(
        "stopping %d model hosts at once: SIGTERM now, SIGKILL to any left after %.1fs",
        len(agent.residents),
        plan.term_grace_s(loop.time()),
    )
    for task in (runner, stopper):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await agent.shutdown(plan)
    unconfirmed = sorted(r.deployment_id for r in agent.residents)
    log.log(
        logging.ERROR if unconfirmed else logging.INFO,
        "stopped in %.2fs (bound %gs)%s",
        plan.elapsed_s(loop.time()),
        WORKER_STOP_BOUND_S,
        f"; not confirmed gone: {', '.join(unconfirmed)}" if unconfirmed else "",
    )
    # Fenced by a newer generation: exit non-zero so a supervisor restarts a fresh process.
    code = 1 if runner in done else 0
    # A LOAD's thread blocked in a call that never returns would otherwise hold the exit.
    exit_even_if_threads_linger(code, after_s=plan.exit_s(loop.time()))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
