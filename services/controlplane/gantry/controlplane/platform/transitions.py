"""Compare-and-set state changes: the table says if a move is legal, the UPDATE says who won."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.controlplane.evidence.pipeline_states import check_assessment_transition
from gantry.controlplane.evidence.probe_transitions import check_probe_transition
from gantry.controlplane.observability.state_history import record_changes
from gantry.controlplane.platform.state_machines import check_transition

T = TypeVar("T")

# The evidence pipeline's machines keep their tables in their own domain modules.
_PIPELINE_CHECKS: Mapping[str, Callable[[str, str], None]] = {
    "probe": check_probe_transition,
    "assessment": check_assessment_transition,
}


async def compare_and_set(
    session: AsyncSession,
    model: Any,
    key: str,
    *,
    machine: str,
    expected: str,
    target: str,
    now: dt.datetime | None = None,
    **values: Any,
) -> None:
    """`UPDATE model SET state=target WHERE pk=key AND state=expected`; losing is an error.

    Two control-plane replicas racing for the same row cannot both win: the loser's UPDATE matches
    no row and raises INVALID_STATE_TRANSITION instead of overwriting. A real move of a recorded
    machine (deployment, residency, node, job) leaves its history row in the same transaction;
    `now` is its time when `values` write none.
    """
    await compare_and_set_many(
        session,
        model,
        [key],
        machine=machine,
        expected=expected,
        target=target,
        now=now,
        **values,
    )


async def compare_and_set_many(
    session: AsyncSession,
    model: Any,
    keys: Sequence[str],
    *,
    machine: str,
    expected: str,
    target: str,
    now: dt.datetime | None = None,
    **values: Any,
) -> None:
    """`compare_and_set` of every row of `keys` (distinct), in one UPDATE and one history INSERT:
    losing any one is the error, so the caller's transaction rolls back whole. Nothing for no
    keys."""
    if not keys:
        return
    if expected != target:
        pipeline_check = _PIPELINE_CHECKS.get(machine)
        if pipeline_check is not None:
            pipeline_check(expected, target)
        else:
            check_transition(machine, expected, target)
    primary_key = next(iter(model.__table__.primary_key.columns))
    result = await session.execute(
        update(model)
        .where(primary_key.in_(keys) if len(keys) > 1 else primary_key == keys[0])
        .where(model.state == expected)
        .values(state=target, **values)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount != len(keys):  # type: ignore[attr-defined]
        named = keys[0] if len(keys) == 1 else f"{keys[0]} (or another of {len(keys)})"
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"{machine} {named} was no longer {expected} (concurrent change)",
            machine=machine,
            expected=expected,
            target=target,
            conflict="true",
        )
    if expected != target:
        await record_changes(
            session,
            model,
            keys,
            machine=machine,
            from_state=expected,
            to_state=target,
            values=values,
            at=now,
        )


def lost_a_race(error: GantryError) -> bool:
    """True for a compare-and-set another writer won (worth a retry on fresh rows)."""
    return error.reason == "INVALID_STATE_TRANSITION" and error.metadata.get("conflict") == "true"


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]], *, attempts: int = 3) -> T:
    """Run a unit of work again (a new transaction, fresh rows) when it lost a race."""
    for remaining in range(attempts - 1, -1, -1):
        try:
            return await attempt()
        except GantryError as error:
            if not lost_a_race(error) or remaining == 0:
                raise
    raise AssertionError("unreachable")
