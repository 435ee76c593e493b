"""Runtime profiles: immutable settings for running one assessed artifact set.

Nothing here changes a profile's settings. The only update is the measured peak a completed probe
raises, and it only ever rises: a conditional UPDATE, so two probes finishing at once cannot
lower what the other recorded.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.ids import new_id
from gantry.controlplane.platform.models import RuntimeProfile
from gantry.controlplane.platform.rows import get_row


async def create_profile(
    session: AsyncSession,
    *,
    name: str,
    assessment_id: str,
    artifact_set_id: str,
    environment_id: str,
    adapter: dict[str, Any],
    ram_estimate_bytes: int,
    vram_estimate_bytes: int,
    created_by: str,
    now: dt.datetime,
) -> RuntimeProfile:
    row = RuntimeProfile(
        profile_id=new_id(),
        name=name,
        assessment_id=assessment_id,
        artifact_set_id=artifact_set_id,
        environment_id=environment_id,
        adapter=adapter,
        ram_estimate_bytes=ram_estimate_bytes,
        vram_estimate_bytes=vram_estimate_bytes,
        ram_measured_peak_bytes=None,
        vram_measured_peak_bytes=None,
        created_at=now,
        created_by=created_by,
    )
    session.add(row)
    await session.flush()
    return row


async def get_profile(session: AsyncSession, profile_id: str) -> RuntimeProfile:
    return await get_row(session, RuntimeProfile, profile_id, "runtime profile")


async def list_profiles(
    session: AsyncSession, *, after: str, limit: int, artifact_set_id: str = ""
) -> Sequence[RuntimeProfile]:
    query = select(RuntimeProfile).where(RuntimeProfile.profile_id > after)
    if artifact_set_id:
        query = query.where(RuntimeProfile.artifact_set_id == artifact_set_id)
    query = query.order_by(RuntimeProfile.profile_id).limit(limit)
    return (await session.scalars(query)).all()


async def raise_measured_peaks(
    session: AsyncSession,
    profile: RuntimeProfile,
    *,
    ram_peak_bytes: int | None,
    vram_peak_bytes: int | None,
) -> None:
    """Record a probe's measured peaks where they exceed what is recorded (None: not measured)."""
    for column, value in (
        (RuntimeProfile.ram_measured_peak_bytes, ram_peak_bytes),
        (RuntimeProfile.vram_measured_peak_bytes, vram_peak_bytes),
    ):
        if value is None:
            continue
        await session.execute(
            update(RuntimeProfile)
            .where(
                RuntimeProfile.profile_id == profile.profile_id,
                or_(column.is_(None), column < value),
            )
            .values({column.key: value})
            .execution_options(synchronize_session="fetch")
        )
    await session.refresh(profile)
