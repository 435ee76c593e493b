"""Reading one row by its primary key, the way every store does: the row, or NOT_FOUND naming it."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import not_found

Row = TypeVar("Row")


async def get_row(session: AsyncSession, model: type[Row], key: str, kind: str) -> Row:
    """The `model` row whose primary key is `key`; NOT_FOUND ("<kind> <key> not found") if none."""
    row = await session.get(model, key)
    if row is None:
        raise not_found(kind, key)
    return row
