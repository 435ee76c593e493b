"""Circuit breakers per (node, deployment) and per node: every state change goes through the one
TRANSITIONS table, and only INFRA-class failures ever count toward opening one.

A breaker opens after `threshold` consecutive infra failures, stays open for `cooldown_seconds`,
then lets exactly one probe through (HALF_OPEN): the probe's success closes it, its infra failure
opens it again with a fresh cooldown. A request failure says nothing bad about the runtime; it did
answer, so the breaker treats it as a success. A cancelled call says nothing at all, except that a
probe cut short frees the probe slot for another.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from gantry.common.errors import GantryError
from gantry.scheduler.policy.types import BreakerState, Outcome

NODE_BREAKER = ""  # the deployment id under which a node's own breaker is kept


class BreakerEvent(enum.Enum):
    INFRA_FAILURE = "INFRA_FAILURE"  # in CLOSED: fed only once the consecutive count reaches it
    SUCCESS = "SUCCESS"
    COOLDOWN_ELAPSED = "COOLDOWN_ELAPSED"
    PROBE_CANCELLED = "PROBE_CANCELLED"


TRANSITIONS: Mapping[tuple[BreakerState, BreakerEvent], BreakerState] = {
    (BreakerState.CLOSED, BreakerEvent.INFRA_FAILURE): BreakerState.OPEN,
    (BreakerState.CLOSED, BreakerEvent.SUCCESS): BreakerState.CLOSED,
    # A call that was already running when the breaker opened may still end either way; neither
    # outcome is a probe's, so the cooldown stands.
    (BreakerState.OPEN, BreakerEvent.INFRA_FAILURE): BreakerState.OPEN,
    (BreakerState.OPEN, BreakerEvent.SUCCESS): BreakerState.OPEN,
    (BreakerState.OPEN, BreakerEvent.COOLDOWN_ELAPSED): BreakerState.HALF_OPEN,
    (BreakerState.HALF_OPEN, BreakerEvent.INFRA_FAILURE): BreakerState.OPEN,
    (BreakerState.HALF_OPEN, BreakerEvent.SUCCESS): BreakerState.CLOSED,
    (BreakerState.HALF_OPEN, BreakerEvent.PROBE_CANCELLED): BreakerState.HALF_OPEN,
}


def transition(state: BreakerState, event: BreakerEvent) -> BreakerState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"a {state.name} breaker cannot take {event.name}",
            state=state.name,
            event=event.name,
        ) from None


@dataclass(frozen=True, slots=True)
class BreakerChange:
    node_id: str
    deployment_id: str  # "" = the node's own breaker
    state: BreakerState
    consecutive_failures: int


@dataclass(frozen=True, slots=True)
class BreakerView:
    node_id: str
    deployment_id: str  # "" = the node's own breaker
    state: BreakerState
    consecutive_failures: int
    cooldown_left: float  # seconds until an OPEN breaker goes HALF_OPEN; 0 otherwise


@dataclass(slots=True)
class _Breaker:
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    probe_in_flight: bool = False

    @property
    def lets_calls_through(self) -> bool:
        if self.state is BreakerState.CLOSED:
            return True
        return self.state is BreakerState.HALF_OPEN and not self.probe_in_flight

    @property
    def at_rest(self) -> bool:
        return self.state is BreakerState.CLOSED and self.consecutive_failures == 0


class BreakerBoard:
    """Every breaker not at rest (closed, no failures); one at rest is simply absent."""

    def __init__(self, *, threshold: int = 3, cooldown_seconds: float = 30.0) -> None:
        if threshold < 1:
            raise GantryError("INVALID_ARGUMENT", f"threshold must be >= 1, got {threshold}")
        self._threshold = threshold
        self._cooldown_seconds = cooldown_seconds
        self._breakers: dict[tuple[str, str], _Breaker] = {}

    def allows(self, node_id: str, deployment_id: str, now: float) -> bool:
        if not self._breakers:  # the common case, on the dispatch hot path: all at rest
            return True
        return all(
            breaker.lets_calls_through
            for key in _keys(node_id, deployment_id)
            if (breaker := self._breakers.get(key)) is not None
        )

    def started(self, node_id: str, deployment_id: str, now: float) -> None:
        if not self._breakers:
            return
        for key in _keys(node_id, deployment_id):
            breaker = self._breakers.get(key)
            if breaker is not None and breaker.state is BreakerState.HALF_OPEN:
                breaker.probe_in_flight = True

    def record(
        self,
        node_id: str,
        deployment_id: str,
        outcome: Outcome,
        now: float,
        *,
        node_wide: bool = True,
    ) -> list[BreakerChange]:
        """`node_wide=False`: an INFRA failure of the model host alone (it crashed, ran out of
        memory): it counts on the (node, deployment) breaker, not on the node's."""
        breakers = self._breakers
        if outcome is not Outcome.INFRA_FAILURE and (
            not breakers
            or (
                (node_id, deployment_id) not in breakers and (node_id, NODE_BREAKER) not in breakers
            )
        ):
            return []  # a breaker at rest stays at rest unless a failure counts
        changes: list[BreakerChange] = []
        for key in _keys(node_id, deployment_id):
            if not node_wide and key[1] == NODE_BREAKER and outcome is Outcome.INFRA_FAILURE:
                continue
            breaker = self._breakers.get(key) or _Breaker()
            before = breaker.state
            _apply_outcome(breaker, outcome, now, self._threshold)
            if breaker.at_rest:
                self._breakers.pop(key, None)
            else:
                self._breakers[key] = breaker
            if breaker.state is not before:
                changes.append(_change(key, breaker))
        return changes

    def tick(self, now: float) -> list[BreakerChange]:
        changes: list[BreakerChange] = []
        for key, breaker in sorted(self._breakers.items()):
            if (
                breaker.state is BreakerState.OPEN
                and now - breaker.opened_at >= self._cooldown_seconds
            ):
                breaker.state = transition(breaker.state, BreakerEvent.COOLDOWN_ELAPSED)
                breaker.probe_in_flight = False
                changes.append(_change(key, breaker))
        return changes

    def forget(self, node_id: str, deployment_id: str | None = None) -> None:
        """One (node, deployment) breaker, or with no deployment the node's and all of its pairs."""
        if deployment_id is not None:
            self._breakers.pop((node_id, deployment_id), None)
            return
        for key in [key for key in self._breakers if key[0] == node_id]:
            del self._breakers[key]

    def forget_deployment(self, deployment_id: str) -> None:
        """Every node's breaker for the deployment (it was removed); the nodes' own stay."""
        if deployment_id == NODE_BREAKER:
            return
        for key in [key for key in self._breakers if key[1] == deployment_id]:
            del self._breakers[key]

    def views(self, now: float) -> list[BreakerView]:
        """Every breaker that is not CLOSED or has failures counted, by (node, deployment)."""
        return [
            BreakerView(
                node_id=node_id,
                deployment_id=deployment_id,
                state=breaker.state,
                consecutive_failures=breaker.consecutive_failures,
                cooldown_left=(
                    max(0.0, breaker.opened_at + self._cooldown_seconds - now)
                    if breaker.state is BreakerState.OPEN
                    else 0.0
                ),
            )
            for (node_id, deployment_id), breaker in sorted(self._breakers.items())
        ]

    def state(self, node_id: str, deployment_id: str = NODE_BREAKER) -> BreakerState:
        breaker = self._breakers.get((node_id, deployment_id))
        return breaker.state if breaker is not None else BreakerState.CLOSED


def _keys(node_id: str, deployment_id: str) -> tuple[tuple[str, str], ...]:
    if deployment_id == NODE_BREAKER:
        return ((node_id, NODE_BREAKER),)
    return ((node_id, deployment_id), (node_id, NODE_BREAKER))


def _apply_outcome(breaker: _Breaker, outcome: Outcome, now: float, threshold: int) -> None:
    if outcome is Outcome.CANCELLED:
        if breaker.state is BreakerState.HALF_OPEN and breaker.probe_in_flight:
            breaker.state = transition(breaker.state, BreakerEvent.PROBE_CANCELLED)
            breaker.probe_in_flight = False
        return
    if outcome is Outcome.INFRA_FAILURE:
        breaker.consecutive_failures += 1
        if breaker.state is BreakerState.CLOSED and breaker.consecutive_failures < threshold:
            return  # counted, not yet a transition
        before = breaker.state
        breaker.state = transition(before, BreakerEvent.INFRA_FAILURE)
        if before is not BreakerState.OPEN:  # opening, or a failed probe: the cooldown restarts
            breaker.opened_at = now
        breaker.probe_in_flight = False
        return
    # SUCCESS, or REQUEST_FAILURE: the runtime answered, which is what a breaker asks.
    before = breaker.state
    breaker.state = transition(before, BreakerEvent.SUCCESS)
    if breaker.state is BreakerState.CLOSED:
        breaker.consecutive_failures = 0
        breaker.probe_in_flight = False


def _change(key: tuple[str, str], breaker: _Breaker) -> BreakerChange:
    node_id, deployment_id = key
    return BreakerChange(
        node_id=node_id,
        deployment_id=deployment_id,
        state=breaker.state,
        consecutive_failures=breaker.consecutive_failures,
    )
