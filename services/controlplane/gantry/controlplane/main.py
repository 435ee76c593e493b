"""`gantry controlplane`: run the control plane server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from gantry.common.process import run_until_signalled, setup_logging
from gantry.common.telemetry import setup_tracing
from gantry.controlplane.app import ControlPlaneSettings, start_control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gantry controlplane")
    parser.add_argument("--listen", default="127.0.0.1:50051")
    parser.add_argument("--database-url", default="sqlite+aiosqlite:///.gantry/gantry.db")
    parser.add_argument("--scheduler", default="127.0.0.1:50052")
    parser.add_argument("--scheduler-token-file", type=Path, required=True)
    parser.add_argument("--bootstrap-operator-token-file", type=Path)
    parser.add_argument("--artifact-root", type=Path, help="accepted for symmetry; unused here")
    args = parser.parse_args(argv)
    setup_logging("controlplane")
    setup_tracing("gantry-controlplane")
    bootstrap = args.bootstrap_operator_token_file
    settings = ControlPlaneSettings(
        listen=args.listen,
        database_url=args.database_url,
        scheduler_address=args.scheduler,
        scheduler_token=args.scheduler_token_file.read_text().strip(),
        bootstrap_operator_token=bootstrap.read_text().strip() if bootstrap else None,
    )

    async def serve() -> None:
        control_plane = await start_control_plane(settings)
        logging.getLogger(__name__).info("control plane listening on port %d", control_plane.port)
        await run_until_signalled()
        await control_plane.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
