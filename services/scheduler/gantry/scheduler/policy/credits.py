"""Credits: slots leased ahead of need to a control-plane stream, so that an uncontended call is
dispatched by the control plane itself, with no scheduler round trip before it goes. Pure.

A credit is a lease on `slots` slots of one residency for one tenant's INTERACTIVE calls to one
deployment, held by one stream (its origin). From its grant until it comes back it counts as in
flight, for its tenant and on its residency, exactly like a dispatched call: the tenant's share
of the slots (slot_shares), its max_concurrency and the residency's room all see it, whichever
stream holds it, so credits on every replica's stream count against the same slots. The control
plane runs at most one call at a time on a credit and reports each afterwards (WorkFinished with
the credit's id, batched with the stream's other inputs), which the core counts served then.

When to grant (`may_grant`): to a stream whose control plane takes credits (its snapshot says
so; an older one would never return them), after one of the tenant's calls to the deployment came
back a success through the queue on that stream, while the deployment is quiet (nothing waits in its
queue, and nothing has waited for `quiet_seconds`), its residency routable with closed breakers,
the tenant free of a budget (a budget is charged at admission; a credited call is charged only
after it ran) and under its concurrency, the stream under `per_tenant` credits for the pair, and
the deployment's credits within its routable slots less a reserve (`credit_room`: an eighth, at
least one), which serves the queue at once: a newcomer's first call does not wait for a revoke.

When to revoke (`CreditBook.revoke`): as soon as work waits for the deployment (contention:
another tenant, a priority, a tenant at its share), its residency stops being routable or one of
its breakers leaves CLOSED, or the tenant's policy changes. A revoked credit still holds its slots
until the control plane returns it (after its call in flight, if any); from then on it is never
used, and its slots serve the queue. A stream that ends takes its credits with it (`drop`).

One wait is not contention: an INTERACTIVE call that comes to wait while its own stream holds
credits for its (deployment, tenant) and nothing else waits there unexplained. That is the race
between a credit granted when a call ended and its client's next call, which reached the
scheduler before the credit reached the control plane; the credit holds the slot the call waits
for. Only that stream's newest credit for the pair is revoked (`revoke_newest`), one per such
call, and no quiet period starts. Issue 29: with 32 clients of one tenant on 32 slots, the
contention this race caused revoked every credit and, the deployment never quiet for a second
under that load, kept them from coming back: a run went on with no credit at all, every call a
scheduler round trip. Further waits of that tenant revoke one credit each, until none is left and
the next is contention as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Credits one stream holds per (deployment, tenant) at most: enough for one tenant's concurrent
# calls on a residency of 32 slots. Issue 29, 32 concurrent clients of one tenant on such a
# residency: at 2 per stream 94 % of the calls went through the queue, a scheduler round trip each;
# at 16, with credits held to half the slots, half of them did; with 32 and the reserve an eighth,
# 4 in 32 can, and the scheduler's and the control plane's CPU per call fell again (the note's
# figures). Contention still revokes every one of them at once.
DEFAULT_CREDITS_PER_TENANT = 32
# The share of a deployment's routable slots credits never hold, so that a call of another tenant
# or priority is dispatched at once (its wait would revoke the credits, but the revoked ones hold
# their slots until their calls in flight end).
RESERVE_FRACTION = 8
DEFAULT_QUIET_SECONDS = 1.0  # after work waited for a deployment, no credit for it this long


@dataclass(frozen=True, slots=True)
class CreditGranted:
    """A decision: the credit goes to the stream `origin`."""

    credit_id: str
    origin: str
    deployment_id: str
    tenant_id: str
    residency_id: str
    node_id: str
    slots: int


@dataclass(frozen=True, slots=True)
class CreditsRevoked:
    """A decision: the stream `origin` must stop using these credits and return them."""

    origin: str
    credit_ids: tuple[str, ...]


@dataclass(slots=True)
class Credit:
    grant: CreditGranted
    revoked: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GrantFacts:
    """What the core knows, when a call through the queue came back, about granting a credit."""

    per_tenant: int  # the setting; 0 = credits off
    held: int  # credits this stream holds for the (deployment, tenant)
    queue_empty: bool
    quiet: bool  # no work has waited for the deployment within quiet_seconds
    routable: bool  # the residency is routable and both its breakers are CLOSED
    tenant_free: bool  # no budget, and outstanding calls under its concurrency
    free_slots: int  # the residency's slots not in flight
    slots: int  # what the credit would hold
    credit_slots: int  # slots the deployment's credits hold already, on every stream
    routable_slots: int  # the deployment's routable slots


def may_grant(facts: GrantFacts) -> bool:
    """Whether a credit goes to the stream now (the module's rules)."""
    return (
        facts.per_tenant > 0
        and facts.held < facts.per_tenant
        and facts.queue_empty
        and facts.quiet
        and facts.routable
        and facts.tenant_free
        and facts.slots <= facts.free_slots
        and facts.credit_slots + facts.slots <= credit_room(facts.routable_slots)
    )


def credit_room(routable_slots: int) -> int:
    """Slots a deployment's credits may hold in all: every routable slot but the reserve (an
    eighth, at least one), and one where there is only one (a lone slot may still be leased)."""
    reserve = max(1, -(-routable_slots // RESERVE_FRACTION))
    return max(1, routable_slots - reserve)


class CreditBook:
    """Every credit granted and not yet returned, by id and by deployment (the hot path asks by
    deployment: on every settle, and at each contention); ids are never reused by one book."""

    def __init__(self) -> None:
        self._credits: dict[str, Credit] = {}
        self._by_deployment: dict[str, dict[str, Credit]] = {}
        self._issued = 0

    def __len__(self) -> int:
        return len(self._credits)

    def clear(self) -> None:
        self._credits.clear()
        self._by_deployment.clear()

    def grant(
        self,
        *,
        origin: str,
        deployment_id: str,
        tenant_id: str,
        residency_id: str,
        node_id: str,
        slots: int,
    ) -> CreditGranted:
        self._issued += 1
        grant = CreditGranted(
            credit_id=f"credit-{self._issued}",
            origin=origin,
            deployment_id=deployment_id,
            tenant_id=tenant_id,
            residency_id=residency_id,
            node_id=node_id,
            slots=slots,
        )
        credit = Credit(grant)
        self._credits[grant.credit_id] = credit
        self._by_deployment.setdefault(deployment_id, {})[grant.credit_id] = credit
        return grant

    def get(self, credit_id: str, origin: str) -> CreditGranted | None:
        """The stream's credit by id (another stream's is not its to use)."""
        credit = self._credits.get(credit_id)
        return credit.grant if credit is not None and credit.grant.origin == origin else None

    def held(self, origin: str, deployment_id: str, tenant_id: str) -> int:
        return sum(
            1
            for c in self._on(deployment_id)
            if c.grant.origin == origin and c.grant.tenant_id == tenant_id
        )

    def slots_on(self, deployment_id: str) -> int:
        return sum(c.grant.slots for c in self._on(deployment_id))

    def has(self, deployment_id: str) -> bool:
        return deployment_id in self._by_deployment

    def tenants(self) -> set[str]:
        return {c.grant.tenant_id for c in self._credits.values()}

    def revoke_newest(
        self, origin: str, deployment_id: str, tenant_id: str
    ) -> list[CreditsRevoked]:
        """Revoke the stream's newest credit for (deployment, tenant) not revoked yet, if any: the
        one most likely still on its way to its control plane, unused."""
        for credit in reversed(list(self._on(deployment_id))):
            grant = credit.grant
            if not credit.revoked and grant.origin == origin and grant.tenant_id == tenant_id:
                credit.revoked = True
                return [CreditsRevoked(origin, (grant.credit_id,))]
        return []

    def revoke(
        self, which: Callable[[CreditGranted], bool], *, deployment_id: str | None = None
    ) -> list[CreditsRevoked]:
        """Revoke every credit not revoked yet that `which` picks (of `deployment_id`'s alone,
        when given): one decision per stream."""
        credits = self._credits.values() if deployment_id is None else self._on(deployment_id)
        by_origin: dict[str, list[str]] = {}
        for credit in credits:
            if not credit.revoked and which(credit.grant):
                credit.revoked = True
                by_origin.setdefault(credit.grant.origin, []).append(credit.grant.credit_id)
        return [CreditsRevoked(origin, tuple(ids)) for origin, ids in sorted(by_origin.items())]

    def take_back(self, origin: str, credit_ids: Iterable[str]) -> list[CreditGranted]:
        """The stream returned these: they leave the book (an unknown or foreign id is ignored)."""
        returned = []
        for credit_id in credit_ids:
            credit = self._credits.get(credit_id)
            if credit is not None and credit.grant.origin == origin:
                del self._credits[credit_id]
                deployment_id = credit.grant.deployment_id
                on = self._by_deployment[deployment_id]
                del on[credit_id]
                if not on:
                    del self._by_deployment[deployment_id]
                returned.append(credit.grant)
        return returned

    def drop(self, origin: str) -> list[CreditGranted]:
        """The stream ended: every credit it held leaves the book."""
        return self.take_back(
            origin, [i for i, c in self._credits.items() if c.grant.origin == origin]
        )

    def _on(self, deployment_id: str) -> Iterable[Credit]:
        return self._by_deployment.get(deployment_id, {}).values()
