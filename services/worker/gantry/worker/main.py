"""`gantry worker`: connect out to the control plane and serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

from gantry.common.process import run_until_signalled, setup_logging
from gantry.common.telemetry import setup_tracing
from gantry.worker.agent import WorkerAgent, WorkerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gantry worker")
    parser.add_argument("--control-plane", default="127.0.0.1:50051")
    parser.add_argument("--credential-file", type=Path, required=True)
    parser.add_argument("--artifact-root", type=Path, required=True)
    parser.add_argument("--max-residents", type=int, default=8)
    args = parser.parse_args(argv)
    setup_logging("worker")
    setup_tracing("gantry-worker")
    settings = WorkerSettings(
        control_plane=args.control_plane,
        credential=args.credential_file.read_text().strip(),
        artifact_root=args.artifact_root,
        max_residents=args.max_residents,
    )

    async def serve() -> int:
        agent = WorkerAgent(settings)
        logging.getLogger(__name__).info("worker generation %d", agent.generation)
        runner = asyncio.create_task(agent.run())
        stopper = asyncio.create_task(run_until_signalled())
        done, _ = await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (runner, stopper):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await agent.shutdown()
        # Fenced by a newer generation: exit non-zero so a supervisor restarts a fresh process.
        return 1 if runner in done else 0

    return asyncio.run(serve())


if __name__ == "__main__":
    raise SystemExit(main())
