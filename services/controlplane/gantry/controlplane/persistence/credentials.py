"""Operator tokens, tenants and client API keys: hashes at rest, lookups by token id."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common import tokens
from gantry.common.ids import new_id
from gantry.controlplane.persistence.models import ApiKey, OperatorToken, Tenant


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
        tenant = Tenant(tenant_id=tenant_id, created_at=now)
        session.add(tenant)
        await session.flush()
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
