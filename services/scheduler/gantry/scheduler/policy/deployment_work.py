"""One deployment's work in the scheduler: its fair queue, recent waits, and the slots each tenant's
calls in flight hold there, which decide whether a tenant may take more of the deployment's slots
(the caps are slot_shares'), and the autoscaler's signal read from them. Pure: the core feeds it
what it dispatched and what finished."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gantry.scheduler.policy.autoscale import ScaleSignal
from gantry.scheduler.policy.events import DeploymentInfo
from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork
from gantry.scheduler.policy.residency_slots import ResidencySlots
from gantry.scheduler.policy.slot_shares import slot_caps


@dataclass(slots=True)
class DeploymentWork:
    queue: FairQueue
    waits: deque[float] = field(default_factory=deque)
    running: dict[str, int] = field(default_factory=dict)  # tenant -> slots its calls hold here

    @property
    def idle(self) -> bool:
        """Nothing waits and nothing runs: the deployment's entry can go."""
        return not len(self.queue) and not self.running

    def took(self, tenant_id: str, slots: int) -> None:
        self.running[tenant_id] = self.running.get(tenant_id, 0) + slots

    def released(self, tenant_id: str, slots: int) -> None:
        left = self.running.get(tenant_id, 0) - slots
        if left > 0:
            self.running[tenant_id] = left
        else:
            self.running.pop(tenant_id, None)

    def under_share(
        self, weight_of: Callable[[str], int], slots_of: Callable[[], tuple[int, int]]
    ) -> Callable[[QueuedWork], bool] | None:
        """Whether a tenant's next call may take its slots now; None when every tenant's may (one
        tenant alone has every slot). `slots_of` gives the deployment's routable slots and the
        most one residency has (what a call takes at most).

        A tenant with nothing in flight always may. One holding slots may while the call's middle
        slot falls under its cap (`held + (take - 1) / 2 < cap`): a call of one slot goes while the
        tenant is under its cap, as before, and a bigger one overshoots or undershoots the cap by at
        most half a call, so the tenants' shares stay by weight whatever the calls' sizes. The caps
        are weighed only when a tenant with calls in flight asks (most pumps under load find no
        free slot and never weigh)."""
        running = self.running
        if not running or (len(running) == 1 and self.queue.depths().keys() <= running.keys()):
            return None
        caps: dict[str, float] = {}
        largest = 1

        def eligible(queued: QueuedWork) -> bool:
            nonlocal largest
            held = running.get(queued.tenant_id, 0)
            if not held:
                return True
            if not caps:
                waiting = self.queue.waiting_inputs()
                weights = {t: max(1, weight_of(t)) for t in waiting.keys() | running.keys()}
                total, largest = slots_of()
                caps.update(slot_caps(waiting, running, weights, total))
            take = min(queued.inputs, largest)
            return held + (take - 1) / 2 < caps[queued.tenant_id]

        return eligible


def scale_signal(
    deployment: DeploymentInfo, work: DeploymentWork | None, residencies: Sequence[ResidencySlots]
) -> ScaleSignal:
    """What the autoscaler weighs for one deployment: its replicas, what waits and runs, how long
    calls waited lately."""
    waits = list(work.waits) if work else []
    return ScaleSignal(
        deployment_id=deployment.deployment_id,
        replicas=deployment.replicas,
        min_replicas=deployment.min_replicas,
        max_replicas=deployment.max_replicas,
        queued=sum(work.queue.waiting_inputs().values()) if work else 0,
        in_flight=sum(r.in_flight for r in residencies),
        slots_per_replica=max([max(1, r.info.slots) for r in residencies] or [1]),
        queue_wait_p50=statistics.median(waits) if waits else 0.0,
    )
