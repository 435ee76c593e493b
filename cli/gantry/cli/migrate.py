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
from gantry.cli.roles import MIGRATE_MODULE, load_service_module


def add_migrate_command(command: AddCommand) -> None:
    parser = command("migrate", migrate, "create or upgrade the control plane's database schema")
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default: the SQLite database in the state directory)",
    )


def migrate(context: CommandContext, args: argparse.Namespace) -> int:
    # By name, at run time: the CLI installs without the control plane, SQLAlchemy or Alembic.
    database = load_service_module("controlplane", MIGRATE_MODULE)
    from sqlalchemy.exc import SQLAlchemyError  # installed with the control plane

    url: str | None = args.database_url
    if url is None:
        context.paths.create()  # the default database lives in the state directory
        url = context.paths.database_url
    shown_url = database.shown_url(url)
    path = database.sqlite_file(url)
    if path is not None and not Path(path).parent.is_dir():
        raise CliError(f"the directory {Path(path).parent} for the database does not exist")
    try:
        record = asyncio.run(database.migrate_database(url))
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
        raise CliError(f"cannot migrate {shown_url}: {first_line}") from None
    print(
        f"database {shown_url} is at schema revision {record.schema_revision}"
        f" (installation {record.installation_id}, gantry {record.gantry_version})",
        flush=True,
    )
    return 0
