"""What each deployment's residencies charge the scheduler's ledger: read from the deployment and
its runtime profile, and kept in a book the Announcer consults, so that a residency is never
announced without its envelope (an update without claims would release its charge).

The book learns a deployment's charge where the control plane reads it anyway: at every placement
and in every snapshot the scheduler rebuilds from (every live deployment, and every deployment
with a live residency). It holds one small entry per deployment it has seen in this process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments.requirements import ResidencyCharge, residency_charge
from gantry.controlplane.evidence.envelope import profile_envelope
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import Deployment, RuntimeProfile

# A deployment made before runtime profiles has no envelope: it charges no bytes.
_NO_ENVELOPE = (0, 0)


async def read_charges(
    session: AsyncSession, deployment_ids: Iterable[str]
) -> dict[str, ResidencyCharge]:
    """The charge of each deployment that exists among `deployment_ids`."""
    wanted = sorted(set(deployment_ids))
    if not wanted:
        return {}
    rows = (
        await session.scalars(select(Deployment).where(Deployment.deployment_id.in_(wanted)))
    ).all()
    profile_ids = sorted({row.profile_id for row in rows if row.profile_id})
    profiles = (
        {
            profile.profile_id: profile
            for profile in await session.scalars(
                select(RuntimeProfile).where(RuntimeProfile.profile_id.in_(profile_ids))
            )
        }
        if profile_ids
        else {}
    )
    charges: dict[str, ResidencyCharge] = {}
    for row in rows:
        profile = profiles.get(row.profile_id or "")
        envelope = profile_envelope(profile) if profile is not None else _NO_ENVELOPE
        charges[row.deployment_id] = residency_charge(
            convert.adapter_from_json(row.adapter), envelope
        )
    return charges


class ChargeBook:
    """The last charge read for each deployment."""

    def __init__(self) -> None:
        self._charges: dict[str, ResidencyCharge] = {}

    def learn(self, charges: Mapping[str, ResidencyCharge]) -> None:
        self._charges.update(charges)

    def charge_of(self, deployment_id: str) -> ResidencyCharge | None:
        return self._charges.get(deployment_id)
