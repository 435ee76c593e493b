"""Each tenant's share of a deployment's slots: weighted max-min fair, in slots. Pure.

A slot is one input a model host takes at once (an Embed of 8 texts takes 8 of a residency's
32), so the shares are of the inputs being served, whatever size each tenant's calls are.

Why the fair queue alone is not enough: it decides the order of the work still waiting in the
scheduler, but a residency takes up to `slots` inputs at once and its model host then serves what
it holds in arrival order (the host batches, it does not weigh tenants). By Little's law, a
tenant's share of what the host serves is its share of the inputs in flight there. With a large
slot count every queued call is dispatched at once, a tenant whose own callers keep fewer calls
than the slots waiting is never backlogged in the fair queue, and whichever tenant has a call
waiting takes each freed slot: two saturating tenants weighted 1 and 3 were served 1 : 2.

So a tenant takes more slots of a deployment only while the slots its calls in flight hold there
are under its cap. The caps share the deployment's routable slots by weight, max-min fair
(water-filling) over what each tenant asks: a tenant asking less than its weighted share is
capped at what it asks, and what it leaves is shared by weight among the others. What a tenant
asks counts each of its slots in flight twice: a caller answered sends its next call a round trip
later, unseen here meanwhile, and were that moment's gap handed to another tenant, the host would
serve the other's call in its turn. So a tenant saturating its callers keeps its whole share,
while one asking for little (a trickle of calls) leaves the rest to the others: a tenant alone,
or beside a trickle, still fills every slot.
"""

from __future__ import annotations

from collections.abc import Mapping


def slot_caps(
    waiting: Mapping[str, int],
    running: Mapping[str, int],
    weights: Mapping[str, int],
    slots: int,
) -> dict[str, float]:
    """Each tenant's cap on slots in flight: for every tenant in `waiting` or `running` (the
    inputs of its calls waiting, the slots its calls in flight hold; at least one between them),
    by its weight (>= 1), over the deployment's routable slots.

    A tenant asks for what waits plus twice what runs. Tenants are filled in order of asking
    over weight: each takes the smaller of what it asks and its weight's share of the slots still
    unassigned. Caps may be fractional; the caller admits a tenant while its calls in flight are
    below its cap (deployment_work), so a tenant with nothing in flight may always take one.
    """
    tenants = waiting.keys() | running.keys()
    asks = {t: waiting.get(t, 0) + 2 * running.get(t, 0) for t in tenants}
    caps: dict[str, float] = {}
    remaining = float(slots)
    weight_left = sum(weights[tenant] for tenant in tenants)
    for tenant in sorted(tenants, key=lambda t: (asks[t] / weights[t], t)):
        share = remaining * weights[tenant] / weight_left
        caps[tenant] = min(float(asks[tenant]), share)
        remaining -= caps[tenant]
        weight_left -= weights[tenant]
    return caps
