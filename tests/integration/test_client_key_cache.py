"""The control plane's client-key cache (platform/authn.py): callers that find a key's entry
expired share one database read, a key in use is read again before its entry expires while the
entry still answers, and a revocation is not undone by a read that was already in flight.

Against a real migrated database (SQLite and PostgreSQL); time moves by a ManualClock. Reads are
counted by wrapping `credentials.find_api_key`, which still reads the database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gantry.common.auth import Role
from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.controlplane.platform import authn, credentials
from gantry.controlplane.platform.authn import ControlPlaneAuthenticator
from gantry.controlplane.platform.database import Database
from tests.waiting import poll

TTL = ControlPlaneAuthenticator.CLIENT_KEY_CACHE_SECONDS
AHEAD = ControlPlaneAuthenticator.CLIENT_KEY_REFRESH_AHEAD_S


@dataclass
class Reads:
    """The key reads the authenticator made; while `gate` is clear each read waits on it (after
    its real read, before the answer returns), so a test can act while one is in flight."""

    count: int = 0
    waiting: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def keyed(database: Database) -> AsyncIterator[tuple[str, str]]:
    """A client key of tenant-a: (its id, the plain key)."""
    async with database.transaction() as session:
        row, plain = await credentials.create_api_key(
            session, tenant_id="tenant-a", name="cache", now=ManualClock().now()
        )
    yield row.api_key_id, plain


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    counted = Reads()
    counted.gate.set()
    real = credentials.find_api_key

    async def find_api_key(session: Any, api_key_id: str) -> Any:
        counted.count += 1
        row = await real(session, api_key_id)
        counted.waiting += 1
        try:
            await counted.gate.wait()
        finally:
            counted.waiting -= 1
        return row

    monkeypatch.setattr(authn.credentials, "find_api_key", find_api_key)
    return counted


async def _refresh_held(
    auth: ControlPlaneAuthenticator, plain: str, reads: Reads, clock: ManualClock, *, calls: int
) -> None:
    """Move into the entry's last AHEAD seconds (not yet expired), make `calls` calls, each
    answered from the entry, while the refresh they start is held in flight (one read, whatever
    the count); then let it finish."""
    clock.advance(TTL - AHEAD / 2)
    reads.gate.clear()
    for _ in range(calls):
        assert (await auth.authenticate(Role.CLIENT, plain)).subject == "tenant-a"
    await poll(lambda: reads.waiting == 1, 5, "the background refresh in flight")
    assert reads.count == 2  # the first call's read, and this one refresh
    reads.gate.set()
    await poll(lambda: reads.waiting == 0, 5, "the refresh to finish")


async def test_callers_that_find_the_entry_expired_share_one_read(
    database: Database, keyed: tuple[str, str], reads: Reads
) -> None:
    clock = ManualClock()
    auth = ControlPlaneAuthenticator(database, clock)
    _, plain = keyed
    principals = await asyncio.gather(*(auth.authenticate(Role.CLIENT, plain) for _ in range(32)))
    assert {p.subject for p in principals} == {"tenant-a"}
    assert reads.count == 1

    clock.advance(TTL + 0.1)  # expired: the next callers all miss at once
    reads.gate.clear()
    calls = [asyncio.create_task(auth.authenticate(Role.CLIENT, plain)) for _ in range(32)]
    await poll(lambda: reads.waiting == 1, 5, "the one read of the expired key in flight")
    reads.gate.set()
    assert {p.subject for p in await asyncio.gather(*calls)} == {"tenant-a"}
    assert reads.count == 2
    await auth.close()


async def test_a_key_in_use_is_read_again_before_it_expires_and_answers_meanwhile(
    database: Database, keyed: tuple[str, str], reads: Reads
) -> None:
    clock = ManualClock()
    auth = ControlPlaneAuthenticator(database, clock)
    _, plain = keyed
    await auth.authenticate(Role.CLIENT, plain)
    # Answered from the entry while its refresh is held in flight; later callers start none.
    await _refresh_held(auth, plain, reads, clock, calls=5)

    # The refreshed entry lives TTL from its read: past the old expiry, no caller reads.
    clock.advance(AHEAD)
    assert (await auth.authenticate(Role.CLIENT, plain)).subject == "tenant-a"
    assert reads.count == 2
    await auth.close()


async def test_a_refresh_that_finds_the_key_revoked_refuses_it_from_then_on(
    database: Database, keyed: tuple[str, str], reads: Reads
) -> None:
    clock = ManualClock()
    auth = ControlPlaneAuthenticator(database, clock)
    api_key_id, plain = keyed
    await auth.authenticate(Role.CLIENT, plain)
    async with database.transaction() as session:  # revoked on another replica: no forget here
        await credentials.revoke_api_key(session, api_key_id, now=clock.now())
    await _refresh_held(auth, plain, reads, clock, calls=1)  # the entry answers meanwhile
    with pytest.raises(GantryError) as refused:
        await auth.authenticate(Role.CLIENT, plain)  # before the old entry's expiry
    assert refused.value.reason == "UNAUTHENTICATED"
    await auth.close()


async def test_a_read_in_flight_when_the_key_is_forgotten_does_not_bring_it_back(
    database: Database, keyed: tuple[str, str], reads: Reads
) -> None:
    clock = ManualClock()
    auth = ControlPlaneAuthenticator(database, clock)
    api_key_id, plain = keyed
    reads.gate.clear()
    first = asyncio.create_task(auth.authenticate(Role.CLIENT, plain))
    await poll(lambda: reads.waiting == 1, 5, "the first read in flight")
    # The key is forgotten (as RevokeApiKey does after its commit) while that read, of the row
    # as it was before, is in flight: its answer may serve the call that waited for it, but not
    # fill the cache. (The revocation itself commits after the read here: on SQLite a write
    # waits for the read's transaction, so the two cannot overlap.)
    auth.forget_api_key(api_key_id)
    reads.gate.set()
    await first
    async with database.transaction() as session:
        await credentials.revoke_api_key(session, api_key_id, now=clock.now())
    # A call after the forget reads the database again and is refused.
    with pytest.raises(GantryError) as refused:
        await auth.authenticate(Role.CLIENT, plain)
    assert refused.value.reason == "UNAUTHENTICATED"
    assert reads.count == 2
    await auth.close()
