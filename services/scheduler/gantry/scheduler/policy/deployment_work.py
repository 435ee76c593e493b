"""One deployment's work in the scheduler: its fair queue, recent waits, and each tenant's calls in
flight there, which decide whether a tenant may take another of the deployment's slots (the
caps are slot_shares'). Pure: the core feeds it what it dispatched and what finished."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gantry.scheduler.policy.fair_queue import FairQueue
from gantry.scheduler.policy.slot_shares import slot_caps


@dataclass(slots=True)
class DeploymentWork:
    queue: FairQueue
    waits: deque[float] = field(default_factory=deque)
    running: dict[str, int] = field(default_factory=dict)  # tenant -> its calls in flight here

    @property
    def idle(self) -> bool:
        """Nothing waits and nothing runs: the deployment's entry can go."""
        return not len(self.queue) and not self.running

    def took(self, tenant_id: str) -> None:
        self.running[tenant_id] = self.running.get(tenant_id, 0) + 1

    def released(self, tenant_id: str) -> None:
        left = self.running.get(tenant_id, 0) - 1
        if left > 0:
            self.running[tenant_id] = left
        else:
            self.running.pop(tenant_id, None)

    def under_share(
        self, weight_of: Callable[[str], int], slots_of: Callable[[], int]
    ) -> Callable[[str], bool] | None:
        """Whether a tenant may take another of the deployment's slots now; None when every
        tenant may (one tenant alone has every slot). A tenant with nothing in flight always
        may; the caps are weighed only when a tenant with calls in flight asks (most pumps under
        load find no free slot and never weigh)."""
        running = self.running
        if not running or (len(running) == 1 and self.queue.depths().keys() <= running.keys()):
            return None
        caps: dict[str, float] = {}

        def eligible(tenant_id: str) -> bool:
            held = running.get(tenant_id, 0)
            if not held:
                return True
            if not caps:
                waiting = self.queue.depths()
                weights = {t: max(1, weight_of(t)) for t in waiting.keys() | running.keys()}
                caps.update(slot_caps(waiting, running, weights, slots_of()))
            return held < caps[tenant_id]

        return eligible
