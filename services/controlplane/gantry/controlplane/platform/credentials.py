"""Operator tokens, tenants and client API keys: hashes at rest, lookups by token id."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common import tokens
from gantry.common.errors import not_found
from gantry.common.ids import new_id
from gantry.controlplane.platform.models import ApiKey, OperatorToken, Tenant
from gantry.controlplane.tenants.store import insert_tenant_if_absent


async def count_operator_tokens(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(OperatorToken)) or 0)


async def store_operator_token(session: AsyncSession, token: str, *, now: dt.datetime) -> str:
    """Adopt a minted operator token (bootstrap); returns its id. The token itself is not kept."""
    parsed = tokens.parse_token(token, kind=tokens.OPERATOR_TOKEN)
    if parsed is None:
        raise ValueError("not an operator token")
    session.add(
        OperatorToken(token_id=parsed.token_id, token_hash=tokens.hash_token(token), created_at=now)
    )
    await session.flush()
    return parsed.token_id


async def find_operator_token(session: AsyncSession, token_id: str) -> OperatorToken | None:
    return await session.get(OperatorToken, token_id)


async def ensure_tenant(session: AsyncSession, tenant_id: str, *, now: dt.datetime) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        # Another writer (SetTenantPolicy, a concurrent CreateApiKey) may create it at the same
        # moment: insert-if-absent lets both succeed instead of one failing on the primary key.
        await insert_tenant_if_absent(session, tenant_id, now=now)
        tenant = await session.get(Tenant, tenant_id)
        if tenant is None:  # the insert just ran in this transaction: it cannot be missing
            raise RuntimeError(f"tenant {tenant_id} vanished after its insert")
    return tenant


async def create_api_key(
    session: AsyncSession, *, tenant_id: str, name: str, now: dt.datetime
) -> tuple[ApiKey, str]:
    """A new client key bound to a tenant; the plain key is returned once and never stored."""
    await ensure_tenant(session, tenant_id, now=now)
    api_key_id = new_id()
    plain = tokens.mint_token(tokens.API_KEY, api_key_id)
    row = ApiKey(
        api_key_id=api_key_id,
        tenant_id=tenant_id,
        name=name,
        key_hash=tokens.hash_token(plain),
        created_at=now,
    )
    session.add(row)
    await session.flush()
    return row, plain


async def find_api_key(session: AsyncSession, api_key_id: str) -> ApiKey | None:
    return await session.get(ApiKey, api_key_id)


async def get_api_key(session: AsyncSession, api_key_id: str) -> ApiKey:
    row = await session.get(ApiKey, api_key_id)
    if row is None:
        raise not_found("API key", api_key_id)
    return row


async def revoke_api_key(session: AsyncSession, api_key_id: str, *, now: dt.datetime) -> ApiKey:
    """Idempotent: revoking a revoked key keeps its first revocation time."""
    row = await get_api_key(session, api_key_id)
    if row.revoked_at is None:
        row.revoked_at = now
        await session.flush()
    return row


async def list_api_keys(
    session: AsyncSession, *, after: str, limit: int, tenant_id: str = ""
) -> Sequence[ApiKey]:
    query = select(ApiKey).where(ApiKey.api_key_id > after)
    if tenant_id:
        query = query.where(ApiKey.tenant_id == tenant_id)
    return (await session.scalars(query.order_by(ApiKey.api_key_id).limit(limit))).all()
