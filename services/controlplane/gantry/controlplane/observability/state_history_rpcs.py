"""ListStateTransitions: the recorded history of a deployment, residency, node or job.

ControlPlaneService mixes this in. Read-only: the rows are written where the states change
(observability/state_history.py).
"""

from __future__ import annotations

import grpc

from gantry.common.errors import invalid_argument
from gantry.controlplane.observability import state_history
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.models import StateTransition
from gantry.controlplane.platform.paging import page_of
from gantry.v1 import control_plane_pb2 as cp


class StateHistoryRpcs:
    """Mixed into ControlPlaneService, which sets `_database`."""

    _database: Database

    async def ListStateTransitions(
        self, request: cp.ListStateTransitionsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListStateTransitionsResponse:
        """Oldest first, paged by the row's sequence; a subject with no history lists nothing."""
        if request.subject_kind not in state_history.RECORDED_KINDS:
            raise invalid_argument(
                f"subject_kind must be one of {', '.join(state_history.RECORDED_KINDS)}",
                field="subject_kind",
                subject_kind=request.subject_kind,
            )
        if not request.subject_id:
            raise invalid_argument("subject_id is required", field="subject_id")
        page = page_of(request.page_size, request.page_token)
        after = _sequence(page.after)
        async with self._database.transaction() as session:
            rows = await state_history.list_transitions(
                session,
                subject_kind=request.subject_kind,
                subject_id=request.subject_id,
                after=after,
                limit=page.fetch,
            )
        items, next_token = page.split(rows, key=lambda row: str(row.transition_id))
        return cp.ListStateTransitionsResponse(
            transitions=[state_transition(row) for row in items], next_page_token=next_token
        )


def _sequence(after: str) -> int:
    if not after:
        return 0
    if not after.isdigit():
        raise invalid_argument("page_token is not one this server issued", field="page_token")
    return int(after)


def state_transition(row: StateTransition) -> cp.StateTransition:
    return cp.StateTransition(
        subject_kind=row.subject_kind,
        subject_id=row.subject_id,
        from_state=row.from_state,
        to_state=row.to_state,
        reason=row.reason,
        message=row.message,
        at=convert.timestamp(row.at),
        deployment_id=row.deployment_id or "",
    )
