"""What GET /v1/models reads: the capability bindings and the state of the deployment each names.

A capability is listed while its binding names a live deployment, whatever that deployment's state
(the `gantry.state` field says whether it serves); a binding still waiting for its first deployment,
or naming a deleted one, is not listed.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import not_found
from gantry.controlplane.platform.models import CapabilityBinding, Deployment
from gantry.controlplane.serving.openai_http.responses import ModelEntry

# One page: GET /v1/models has no paging in OpenAI's API, so the list is bounded here.
MAX_MODELS = 1000


async def list_models(session: AsyncSession, *, limit: int = MAX_MODELS) -> list[ModelEntry]:
    rows = await session.execute(_query().order_by(CapabilityBinding.capability).limit(limit))
    return [_entry(binding, deployment) for binding, deployment in rows]


async def get_model(session: AsyncSession, capability: str) -> ModelEntry:
    row = (
        await session.execute(_query().where(CapabilityBinding.capability == capability))
    ).first()
    if row is None:
        raise not_found("model", capability)
    binding, deployment = row
    return _entry(binding, deployment)


def _query():  # type: ignore[no-untyped-def]
    return (
        select(CapabilityBinding, Deployment)
        .join(Deployment, Deployment.deployment_id == CapabilityBinding.deployment_id)
        .where(Deployment.deleted_at.is_(None))
    )


def _entry(binding: CapabilityBinding, deployment: Deployment) -> ModelEntry:
    return ModelEntry(
        capability=binding.capability,
        created=int(deployment.created_at.timestamp()),
        deployment_id=deployment.deployment_id,
        state=deployment.state,
    )
