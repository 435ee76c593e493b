"""Compare-and-set state changes: the table says if a move is legal, the UPDATE says who won."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.controlplane.domain.transitions import check_transition


async def compare_and_set(
    session: AsyncSession,
    model: Any,
    key: str,
    *,
    machine: str,
    expected: str,
    target: str,
    **values: Any,
) -> None:
    """`UPDATE model SET state=target WHERE pk=key AND state=expected`; losing is an error.

    Two control-plane replicas racing for the same row cannot both win: the loser's UPDATE matches
    no row and raises INVALID_STATE_TRANSITION instead of overwriting.
    """
    if expected != target:
        check_transition(machine, expected, target)
    primary_key = next(iter(model.__table__.primary_key.columns))
    result = await session.execute(
        update(model)
        .where(primary_key == key, model.state == expected)
        .values(state=target, **values)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"{machine} {key} was no longer {expected} (concurrent change)",
            machine=machine,
            expected=expected,
            target=target,
        )
