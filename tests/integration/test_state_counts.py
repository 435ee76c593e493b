"""The state gauges' counts (observability/state_counts.py): every state-machine table's rows per
state, read in one statement on every reconciler pass, equal to a GROUP BY of each table.

Both stores; rows written straight into a migrated database.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select

from gantry.common.ids import new_id
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.observability.state_counts import COUNTED, count_by_state
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import Deployment, Residency
from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState
from tests.integration.db_events import STATEMENT, counted

NOW = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)


async def _each_table(database: Database) -> dict[str, dict[str, int]]:
    async with database.transaction() as session:
        counts: dict[str, dict[str, int]] = {}
        for name, model in COUNTED.items():
            rows = await session.execute(select(model.state, func.count()).group_by(model.state))
            counts[name] = {str(state): int(count) for state, count in rows.all()}
        return counts


async def test_one_statement_counts_every_tables_rows_by_state(database: Database) -> None:
    async with database.transaction() as session:
        assert await count_by_state(session) == {"nodes": {}, "deployments": {}, "residencies": {}}
        node, _ = await nodes.register_node(session, name="n", labels={}, now=NOW)
        states = [DeploymentState.READY, DeploymentState.READY, DeploymentState.UNLOADED]
        for deployment_state in states:
            deployment = Deployment(
                deployment_id=new_id(),
                capability=f"c-{new_id()}",
                adapter={},
                state=deployment_state,
                created_at=NOW,
                updated_at=NOW,
            )
            session.add(deployment)
            await session.flush()
            for residency_state in (ResidencyState.RESIDENT, ResidencyState.COLD):
                session.add(
                    Residency(
                        residency_id=new_id(),
                        deployment_id=deployment.deployment_id,
                        node_id=node.node_id,
                        state=residency_state,
                        updated_at=NOW,
                    )
                )
    expected = await _each_table(database)
    assert expected["deployments"] == {"READY": 2, "UNLOADED": 1}
    assert expected["residencies"] == {"RESIDENT": 3, "COLD": 3}
    async with database.transaction() as session:
        assert await count_by_state(session) == expected  # the connection checked out (pinged)
        with counted(database, STATEMENT) as statements:
            assert await count_by_state(session) == expected
    assert statements[0] == 1  # three GROUP BYs before
