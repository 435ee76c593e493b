"""Which of the reconciler's rules have rows to act on, read in one statement before they run.

Why: each rule reads its rows in a transaction of its own, and on a fleet where nothing has
expired, gone stale or absent, and no residency is adopted, UNCERTAIN or DRAINING, and no job is
queued, those reads found nothing once a second. They still cost: measured with `gantry up` on
2 CPUs (issue 29), an idle pass took 14-24 ms of the control plane's event-loop CPU every second,
1-2.5 ms a rule, and the Embed calls that arrived meanwhile waited (at concurrency 1 the slowest
1.5 % came in pairs, a second apart). One statement of EXISTS questions answers all of them at
once; a rule runs only where its answer is yes (or, for staleness, where liveness in memory names
a silent stream).

Each question is the rule's own query (reconciler.py) asked as EXISTS, so a no means the rule
would have read no rows and done nothing. Rules that can make work for later ones in the same
pass (staleness and absence leave replicas to place, scale advice drains a surplus) run before the
questions about that work are asked (`later_rules`); those that queue jobs hand their nodes to
the pass's dispatch themselves.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import BindParameter, ColumnElement, Exists, Select, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped

from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.endpoints.store import ORIGIN_ADOPTED
from gantry.controlplane.jobs.result_plans import MAX_LOAD_ATTEMPTS
from gantry.controlplane.jobs.store import LEASED_JOB_STATES
from gantry.controlplane.platform.models import (
    Deployment,
    Node,
    NodeStream,
    Residency,
    ServingJob,
)
from gantry.controlplane.platform.state_machines import JobState, NodeState, ResidencyState


@dataclass(frozen=True, slots=True)
class FirstRules:
    """Rules 1-3: leases, staleness, absence."""

    expired_leases: bool
    stale_rows: bool  # CONNECTED rows not seen since the staleness grace
    absent: bool  # rows of streams or nodes not heard since the absence grace

    def any(self) -> bool:
        return self.expired_leases or self.stale_rows or self.absent


@dataclass(frozen=True, slots=True)
class LaterRules:
    """Rules 4-7, asked once scale advice is applied: placement, adopted endpoints, UNCERTAIN
    and DRAINING residencies, queued jobs."""

    unplaced: bool  # a live deployment with fewer replicas placed than wanted
    adopted: bool
    uncertain: bool
    draining: bool
    queued_jobs: bool

    def any(self) -> bool:
        return self.unplaced or self.adopted or self.uncertain or self.draining or self.queued_jobs


def _seen_before(
    column: Mapped[dt.datetime | None], when: BindParameter[dt.datetime]
) -> ColumnElement[bool]:
    """The rule's own cut: seen before `when`, or never."""
    return (column < when) | (column.is_(None))


def _first_columns() -> tuple[Exists, Exists, Exists, Exists]:
    """Rules 1-3's questions, with their cuts as parameters (`_cuts` binds the pass's)."""
    now: BindParameter[dt.datetime] = bindparam("now")
    seen_before: BindParameter[dt.datetime] = bindparam("seen_before")
    gone_before: BindParameter[dt.datetime] = bindparam("gone_before")
    absent_before: BindParameter[dt.datetime] = bindparam("absent_before")
    expired = (
        select(ServingJob.job_id)
        .where(ServingJob.state.in_(LEASED_JOB_STATES), ServingJob.lease_expires_at < now)
        .exists()
    )
    stale = (
        select(Node.node_id)
        .where(
            Node.state == NodeState.CONNECTED,
            Node.deleted_at.is_(None),
            _seen_before(Node.last_seen_at, seen_before),
        )
        .exists()
    )
    absent_nodes = (
        select(Node.node_id)
        .where(
            Node.state.in_([NodeState.DISCONNECTED, NodeState.DISABLED]),
            Node.deleted_at.is_(None),
            _seen_before(Node.last_seen_at, absent_before),
        )
        .exists()
    )
    silent_streams = select(NodeStream.node_id).where(NodeStream.heard_at < gone_before).exists()
    return expired, stale, absent_nodes, silent_streams


def _first_answers(row: Sequence[object]) -> FirstRules:
    return FirstRules(
        expired_leases=bool(row[0]), stale_rows=bool(row[1]), absent=bool(row[2] or row[3])
    )


def _cuts(
    *,
    now: dt.datetime,
    seen_before: dt.datetime,
    gone_before: dt.datetime,
    absent_before: dt.datetime,
) -> dict[str, dt.datetime]:
    return {
        "now": now,
        "seen_before": seen_before,
        "gone_before": gone_before,
        "absent_before": absent_before,
    }


# Each statement is built once (with its cuts as parameters): building it and its cache key on
# every pass cost the event loop more than running it.
@functools.cache
def _later_questions() -> Select[bool, bool, bool, bool, bool]:
    return select(*_later_columns())


@functools.cache
def _all_questions() -> Select[bool, bool, bool, bool, bool, bool, bool, bool, bool]:
    return select(*_first_columns(), *_later_columns())


async def all_rules(
    session: AsyncSession,
    *,
    now: dt.datetime,
    seen_before: dt.datetime,
    gone_before: dt.datetime,
    absent_before: dt.datetime,
) -> tuple[FirstRules, LaterRules]:
    """Rules 1-3's and 4-7's answers in one statement, as a pass begins (the cuts as
    reconciler.py computes them: `seen_before` the staleness grace's, `gone_before` the absence
    grace's for stream rows, `absent_before` its cut for nodes): where the first rules
    find nothing to do (the idle pass), nothing can change the later answers before they are
    used, and one statement costs the event loop about half a millisecond whatever it asks
    (issue 29). Where a first rule has work, the later answers are asked again after it."""
    cuts = _cuts(
        now=now, seen_before=seen_before, gone_before=gone_before, absent_before=absent_before
    )
    row = (await session.execute(_all_questions(), cuts)).one()
    return _first_answers(row[:4]), _later_answers(row[4:])


def _unplaced() -> Exists:
    """`placement.missing_replicas` > 0 for some live deployment that placement still tries
    (fewer than MAX_LOAD_ATTEMPTS failed loads): its residencies that are not COLD, on nodes that
    are not DISABLED, fewer than its replicas. Never an adopted one (its endpoint is its only
    residency)."""
    placed = (
        select(func.count(Residency.residency_id))
        .join(Node, Node.node_id == Residency.node_id)
        .where(
            Residency.deployment_id == Deployment.deployment_id,
            Residency.state != ResidencyState.COLD,
            Node.state != NodeState.DISABLED,
        )
        .correlate(Deployment)
        .scalar_subquery()
    )
    return (
        select(Deployment.deployment_id)
        .where(
            Deployment.state.in_(list(LIVE_STATES)),
            Deployment.deleted_at.is_(None),
            Deployment.origin != ORIGIN_ADOPTED,
            Deployment.load_failure_count < MAX_LOAD_ATTEMPTS,
            Deployment.replicas > placed,
        )
        .exists()
    )


def _later_columns() -> tuple[Exists, Exists, Exists, Exists, Exists]:
    """Rules 4-7's questions (they hold no value of their own)."""
    adopted = (
        select(Deployment.deployment_id)
        .where(
            Deployment.state.in_(list(LIVE_STATES)),
            Deployment.deleted_at.is_(None),
            Deployment.origin == ORIGIN_ADOPTED,
        )
        .exists()
    )

    def residencies_in(state: ResidencyState) -> Exists:
        return select(Residency.residency_id).where(Residency.state == state).exists()

    queued = select(ServingJob.job_id).where(ServingJob.state == JobState.QUEUED).exists()
    return (
        _unplaced(),
        adopted,
        residencies_in(ResidencyState.UNCERTAIN),
        residencies_in(ResidencyState.DRAINING),
        queued,
    )


async def later_rules(session: AsyncSession) -> LaterRules:
    """Whether rules 4-7 have rows."""
    return _later_answers((await session.execute(_later_questions())).one())


def _later_answers(row: Sequence[object]) -> LaterRules:
    return LaterRules(
        unplaced=bool(row[0]),
        adopted=bool(row[1]),
        uncertain=bool(row[2]),
        draining=bool(row[3]),
        queued_jobs=bool(row[4]),
    )
