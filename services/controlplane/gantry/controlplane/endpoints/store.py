"""Adopted endpoints: external OpenAI-compatible servers, one per adopted deployment."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import not_found
from gantry.common.ids import new_id
from gantry.controlplane.platform.models import AdoptedEndpoint, Node

ORIGIN_PIPELINE = "pipeline"
ORIGIN_ADOPTED = "adopted"


async def create_endpoint(
    session: AsyncSession,
    *,
    deployment_id: str,
    node_id: str,
    url: str,
    model: str,
    credential_sealed: str,
    now: dt.datetime,
) -> AdoptedEndpoint:
    row = AdoptedEndpoint(
        endpoint_id=new_id(),
        deployment_id=deployment_id,
        node_id=node_id,
        url=url,
        model=model,
        credential_sealed=credential_sealed,
        created_at=now,
    )
    session.add(row)
    await session.flush()
    return row


async def endpoint_of_deployment(session: AsyncSession, deployment_id: str) -> AdoptedEndpoint:
    row = await session.scalar(
        select(AdoptedEndpoint).where(AdoptedEndpoint.deployment_id == deployment_id)
    )
    if row is None:
        raise not_found("adopted endpoint of deployment", deployment_id)
    return row


async def list_endpoints(
    session: AsyncSession, *, after: str, limit: int, include_deleted: bool = False
) -> Sequence[AdoptedEndpoint]:
    query = select(AdoptedEndpoint).where(AdoptedEndpoint.endpoint_id > after)
    if not include_deleted:
        query = query.where(AdoptedEndpoint.deleted_at.is_(None))
    return (await session.scalars(query.order_by(AdoptedEndpoint.endpoint_id).limit(limit))).all()


async def forget_endpoint_of_deployment(
    session: AsyncSession, deployment_id: str, *, now: dt.datetime
) -> AdoptedEndpoint | None:
    """Mark the endpoint forgotten (its deployment deleted); its sealed credential is wiped,
    since nothing will ever send it again. None for a deployment that adopted nothing."""
    row = await session.scalar(
        select(AdoptedEndpoint).where(AdoptedEndpoint.deployment_id == deployment_id)
    )
    if row is None or row.deleted_at is not None:
        return None
    row.deleted_at = now
    row.credential_sealed = ""
    await session.flush()
    return row


async def find_node(session: AsyncSession, node: str) -> Node:
    """A live node by id or by name (NOT_FOUND otherwise)."""
    row = await session.get(Node, node)
    if row is None or row.deleted_at is not None:
        row = await session.scalar(select(Node).where(Node.name == node, Node.deleted_at.is_(None)))
    if row is None:
        raise not_found("node", node)
    return row
