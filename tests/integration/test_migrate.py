"""`gantry migrate` prepares the database; a starting control plane refuses any it did not."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import select, text
from sqlalchemy.engine import Connection

from gantry.common import tokens
from gantry.controlplane.app import ControlPlaneSettings, start_control_plane
from gantry.controlplane.platform.database import (
    Database,
    DatabaseNotInitialised,
    alembic_config,
    head_revision,
    migrate_database,
    sqlite_file,
)
from gantry.controlplane.platform.models import Installation, Tenant

REPO_ROOT = Path(__file__).resolve().parents[2]


def settings(database_url: str) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        listen="127.0.0.1:0",
        database_url=database_url,
        scheduler_address="127.0.0.1:1",  # never reached: these tests stop at the database
        scheduler_token=tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler"),
    )


async def gantry(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (its own event loop, as an operator runs it)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gantry.cli.main", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def installations(database_url: str) -> list[Installation]:
    database = Database.connect(database_url)
    try:
        async with database.transaction() as session:
            return list((await session.scalars(select(Installation))).all())
    finally:
        await database.close()


async def upgrade_to(database_url: str, revision: str) -> None:
    def upgrade(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    database = Database.connect(database_url)
    try:
        async with database.engine.begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await database.close()


async def require_initialised(database_url: str) -> None:
    """The check a control plane start makes (the rest of the start is other tests' business)."""
    database = Database.connect(database_url)
    await database.require_initialised()
    await database.close()


async def refusal(database_url: str) -> str:
    with pytest.raises(DatabaseNotInitialised) as refused:
        await start_control_plane(settings(database_url))
    message = str(refused.value)
    assert "\n" not in message
    return message


async def test_migrate_creates_the_schema_and_one_installation_record_that_reruns_keep(
    database_url: str,
) -> None:
    first = await gantry("migrate", "--database-url", database_url)
    assert first.returncode == 0, first.stderr
    assert f"schema revision {head_revision()}" in first.stdout
    [record] = await installations(database_url)
    assert record.schema_revision == head_revision()
    assert record.gantry_version not in ("", "unknown")
    assert record.installation_id in first.stdout

    second = await gantry("migrate", "--database-url", database_url)
    assert second.returncode == 0, second.stderr
    [again] = await installations(database_url)
    assert (again.installation_id, again.created_at) == (record.installation_id, record.created_at)
    assert again.updated_at >= record.updated_at
    await require_initialised(database_url)


@pytest.mark.postgres
async def test_three_migrations_at_once_on_an_empty_postgresql_database_all_succeed(
    postgres_url: str,
) -> None:
    """Three replicas' `gantry migrate` starting together (a first install's init containers):
    one creates the schema while the others wait on its lock, then find it current."""
    runs = await asyncio.gather(*(gantry("migrate", "--database-url", postgres_url) for _ in "abc"))
    assert [run.returncode for run in runs] == [0, 0, 0], [run.stderr for run in runs]
    [record] = await installations(postgres_url)
    assert record.schema_revision == head_revision()
    await require_initialised(postgres_url)


async def test_a_missing_sqlite_file_is_refused_and_not_created(tmp_path: Path) -> None:
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'gantry.db'}"
    message = await refusal(database_url)
    assert message == (
        f"the database file {tmp_path / 'gantry.db'} does not exist;"
        f" run `gantry migrate --database-url {database_url}` to create it"
    )
    assert list(tmp_path.iterdir()) == []


async def test_an_empty_database_is_refused(database_url: str) -> None:
    path = sqlite_file(database_url)
    if path is not None:
        path.touch()  # an empty file, as an earlier start that created it would have left
    message = await refusal(database_url)
    assert "holds no Gantry schema" in message
    assert "run `gantry migrate --database-url" in message


async def test_an_old_schema_is_refused_until_migrate_upgrades_it_keeping_the_rows(
    database_url: str,
) -> None:
    await upgrade_to(database_url, "0001")
    database = Database.connect(database_url)
    async with database.transaction() as session:
        await session.execute(
            text("INSERT INTO tenants (tenant_id, created_at) VALUES ('kept', CURRENT_TIMESTAMP)")
        )
    await database.close()

    message = await refusal(database_url)
    assert f"is at schema revision 0001, this Gantry needs {head_revision()}" in message
    assert "to upgrade it" in message

    await migrate_database(database_url)
    await require_initialised(database_url)
    database = Database.connect(database_url)
    try:
        async with database.transaction() as session:
            assert [t.tenant_id for t in (await session.scalars(select(Tenant))).all()] == ["kept"]
    finally:
        await database.close()


async def test_a_schema_without_its_installation_record_is_refused(database_url: str) -> None:
    database = Database.connect(database_url)
    await database.migrate()  # the schema alone, as a hand-run Alembic upgrade would leave it
    await database.close()
    assert "has no installation record" in await refusal(database_url)


async def test_a_revision_this_gantry_does_not_know_is_refused_without_suggesting_migrate(
    database_url: str,
) -> None:
    await migrate_database(database_url)
    database = Database.connect(database_url)
    async with database.transaction() as session:
        await session.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    await database.close()
    message = await refusal(database_url)
    assert "schema revision f00d" in message and "does not know" in message
    assert "gantry migrate" not in message


async def test_gantry_controlplane_says_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    token = tmp_path / "scheduler.token"
    token.write_text(tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler"))
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'absent.db'}"
    result = await gantry(
        "controlplane",
        "--listen", "127.0.0.1:0",
        "--database-url", database_url,
        "--scheduler-token-file", str(token),
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the database file {tmp_path / 'absent.db'} does not exist;"
        f" run `gantry migrate --database-url {database_url}` to create it"
    ]
    assert not (tmp_path / "absent.db").exists()


async def test_migrate_explains_a_database_it_cannot_reach(tmp_path: Path) -> None:
    result = await gantry("migrate", "--database-url", f"sqlite+aiosqlite:///{tmp_path}/no/x.db")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == f"error: the directory {tmp_path}/no for the database does not exist"
    )


async def test_migrate_creates_the_sqlite_file_private_and_refuses_a_planted_symlink(
    tmp_path: Path,
):
    from gantry.controlplane.platform.database import migrate_database

    database = tmp_path / "private.db"
    await migrate_database(f"sqlite+aiosqlite:///{database}")
    assert database.stat().st_mode & 0o777 == 0o600
    target = tmp_path / "elsewhere.db"
    planted = tmp_path / "planted.db"
    planted.symlink_to(target)
    with pytest.raises(DatabaseNotInitialised):
        await migrate_database(f"sqlite+aiosqlite:///{planted}")
    assert not target.exists()
