"""`gantry migrate`: create or upgrade the control plane's schema and write its installation record.

The control plane never does this itself: it refuses a database `gantry migrate` has not
prepared, so an empty or mistyped database is an error rather than a fresh, empty Gantry.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from gantry.cli.connection import AddCommand, CommandContext
from gantry.cli.errors import CliError


def add_migrate_command(command: AddCommand) -> None:
    parser = command("migrate", migrate, "create or upgrade the control plane's database schema")
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default: the SQLite database in the state directory)",
    )


def migrate(context: CommandContext, args: argparse.Namespace) -> int:
    try:
        # Lazily: the rest of the CLI must not need SQLAlchemy, Alembic or the service package.
        from sqlalchemy.exc import SQLAlchemyError

        from gantry.controlplane.platform.database import (
            migrate_database,
            shown_url,
            sqlite_file,
        )
    except ModuleNotFoundError as exc:
        raise CliError(f"the control plane is not installed ({exc.name})") from None
    url: str | None = args.database_url
    if url is None:
        context.paths.create()  # the default database lives in the state directory
        url = context.paths.database_url
    path = sqlite_file(url)
    if path is not None and not Path(path).parent.is_dir():
        raise CliError(f"the directory {Path(path).parent} for the database does not exist")
    try:
        record = asyncio.run(migrate_database(url))
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
        raise CliError(f"cannot migrate {shown_url(url)}: {first_line}") from None
    print(
        f"database {shown_url(url)} is at schema revision {record.schema_revision}"
        f" (installation {record.installation_id}, gantry {record.gantry_version})",
        flush=True,
    )
    return 0
