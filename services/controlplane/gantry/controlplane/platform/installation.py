"""The installation record: the one row `gantry migrate` writes to say what this database is."""

from __future__ import annotations

import datetime as dt
from importlib import metadata

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.ids import new_id
from gantry.controlplane.platform.models import Installation

_DISTRIBUTION = "gantry-controlplane"


def gantry_version() -> str:
    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


async def get_installation(session: AsyncSession) -> Installation | None:
    rows = (await session.scalars(select(Installation))).all()
    if len(rows) > 1:
        # Only record_installation writes here, and it keeps one row; two means hand edits.
        raise RuntimeError(f"the database holds {len(rows)} installation records, not one")
    return rows[0] if rows else None


async def record_installation(
    session: AsyncSession, *, schema_revision: str, version: str, now: dt.datetime
) -> Installation:
    """Create the record on the first migration; later ones keep its id and creation time."""
    row = await get_installation(session)
    if row is None:
        row = Installation(
            installation_id=new_id(),
            created_at=now,
            updated_at=now,
            schema_revision=schema_revision,
            gantry_version=version,
        )
        session.add(row)
    else:
        row.schema_revision = schema_revision
        row.gantry_version = version
        row.updated_at = now
    await session.flush()
    return row
