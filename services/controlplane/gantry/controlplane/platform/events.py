"""Domain events: what a unit of work changed, told to whoever follows it once it has committed.

A write records what happened on its transaction's session (`record(session, event)`), next to
the rows it changed. `Database.transaction` publishes the recorded events after a successful
commit, in the order they were recorded, to the subscribers of each event's type (`EventBus`,
filled in one place, `app.py`, when the control plane is composed). So the scheduler, the route
cache, the reconciler and the audit feed never hear of a state that is not in the database yet,
and a new write cannot forget to tell them: it records what happened, not who must hear it.

- A rolled-back transaction publishes nothing.
- An event may imply another, derived when it is published (the rows' final states): a residency
  that went COLD or a node that connected frees capacity (`CapacityFreed` follows it).
- A bracketed event type (`EventBus.bracket`: `BindingMoved` for the route cache) is also told
  before the commit and after it, committed or rolled back: in between, no cached route is served.
- A subscriber that raises is logged and skipped: the commit has happened, every other subscriber
  still hears of it (each follows the database on its own: the scheduler's link resynchronises
  from a snapshot, the reconciler reads the database on its next pass).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments.requirements import ResidencyCharge
from gantry.controlplane.platform.models import Deployment, Node, Residency
from gantry.controlplane.platform.state_machines import ResidencyState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResidenciesChanged:
    """These residencies changed state (an empty tuple still means: routes may be stale)."""

    residencies: tuple[Residency, ...]


@dataclass(frozen=True, slots=True)
class DeploymentChanged:
    """A deployment was created or scaled, or (removed) is being unloaded or was deleted."""

    deployment: Deployment
    removed: bool = False


@dataclass(frozen=True, slots=True)
class NodeChanged:
    """A node changed (state, inventory, deleted); `connected`: the node ids whose stream is open
    here, as far as this change knows (empty when the node is away or being disabled)."""

    node: Node
    connected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChargesLearned:
    """Charges just read (by placement, adoption, a snapshot): later announcements carry them."""

    charges: Mapping[str, ResidencyCharge]


@dataclass(frozen=True, slots=True)
class CapabilityBound:
    """An operator bound a capability (at once or pending): a cached route may name the old one."""

    capability: str


@dataclass(frozen=True, slots=True)
class BindingMoved:
    """A capability binding now names another deployment (or none): routing changes."""


@dataclass(frozen=True, slots=True)
class AuditWritten:
    """The transaction wrote audit events (recorded by `Database.transaction` itself)."""


@dataclass(frozen=True, slots=True)
class CapacityFreed:
    """Refused placements are worth trying again now: capacity may have appeared (derived on
    publishing from a residency gone COLD or a node that connected), or what is wanted changed
    (recorded by a restart or a scale)."""


@dataclass(frozen=True, slots=True)
class ReconcileWanted:
    """Something committed that the reconciler's next pass acts on (a node came or went, a job
    result, a restart or scale that may leave replicas to place)."""


Event = (
    ResidenciesChanged
    | DeploymentChanged
    | NodeChanged
    | ChargesLearned
    | CapabilityBound
    | BindingMoved
    | AuditWritten
    | CapacityFreed
    | ReconcileWanted
)

E = TypeVar("E", bound=Event)

# Where a session keeps the events recorded on it until its transaction ends.
_RECORDED = "gantry.events"


def record(session: AsyncSession, *events: Event) -> None:
    """Record what this transaction changed; published, in this order, once it commits."""
    session.info.setdefault(_RECORDED, []).extend(events)


def recorded(session: AsyncSession) -> list[Event]:
    """The events recorded on session so far, in order."""
    return list(session.info.get(_RECORDED, ()))


def implied(event: Event) -> tuple[Event, ...]:
    """What an event also means, read from its rows as committed."""
    if isinstance(event, ResidenciesChanged) and any(
        row.state == ResidencyState.COLD for row in event.residencies
    ):
        return (CapacityFreed(),)
    if (
        isinstance(event, NodeChanged)
        and event.node.deleted_at is None
        and event.node.node_id in event.connected
    ):
        return (CapacityFreed(),)
    return ()


def with_implied(events: Iterable[Event]) -> list[Event]:
    """Each event followed by what it implies (its subscribers first, then the implied ones')."""
    return [each for event in events for each in (event, *implied(event))]


@dataclass(frozen=True, slots=True)
class _Bracket:
    before: Callable[[], None]
    after: Callable[[], None]


@dataclass(slots=True)
class EventBus:
    """Who hears of each event type; filled once, when the control plane is composed."""

    _subscribers: defaultdict[type, list[Callable[[Any], None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    _brackets: defaultdict[type, list[_Bracket]] = field(default_factory=lambda: defaultdict(list))

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """handler hears every committed event of type kind, after those subscribed before it."""
        self._subscribers[kind].append(handler)

    def bracket(
        self, kind: type[Event], *, before: Callable[[], None], after: Callable[[], None]
    ) -> None:
        """before: just before a transaction that recorded kind commits; after: once it has
        committed or rolled back (once per transaction, however often kind was recorded)."""
        self._brackets[kind].append(_Bracket(before, after))

    def before_commit(self, events: Sequence[Event]) -> list[Callable[[], None]]:
        """Tell the brackets of the kinds recorded; returns what to call once the commit ends."""
        afters: list[Callable[[], None]] = []
        for kind in dict.fromkeys(type(event) for event in events):
            for bracket in self._brackets.get(kind, ()):
                _call(kind.__name__, bracket.before)
                afters.append(bracket.after)
        return afters

    def publish(self, events: Iterable[Event]) -> None:
        """Each event (and what it implies), in order, to its subscribers, in theirs."""
        for event in with_implied(events):
            for handler in self._subscribers.get(type(event), ()):
                _call(type(event).__name__, handler, event)


def settle(afters: Iterable[Callable[[], None]]) -> None:
    """The brackets' after half (committed or rolled back)."""
    for after in afters:
        _call("the end of a commit", after)


def _call(what: str, call: Callable[..., None], *arguments: object) -> None:
    try:
        call(*arguments)
    except Exception:
        # The commit stands whatever a subscriber does: the others still hear of it.
        log.exception("a subscriber to %s failed", what)
