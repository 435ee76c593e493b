"""Rows per state of the state-machine tables: what the reconciler publishes as gauges."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.platform.models import Deployment, Node, Residency

COUNTED: dict[str, type[Node] | type[Deployment] | type[Residency]] = {
    "nodes": Node,
    "deployments": Deployment,
    "residencies": Residency,
}


async def count_by_state(session: AsyncSession) -> dict[str, dict[str, int]]:
    """table name -> state -> rows, one GROUP BY per table."""
    counts: dict[str, dict[str, int]] = {}
    for name, model in COUNTED.items():
        rows = await session.execute(select(model.state, func.count()).group_by(model.state))
        counts[name] = {str(state): int(count) for state, count in rows.all()}
    return counts
