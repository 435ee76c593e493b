"""Authenticates control-plane RPCs by role: operator token, client API key, node credential.

A credential that is not accepted gets one answer (`_refused`), whatever the cause: an id nobody
holds, a revoked key, a deleted node and a wrong secret read the same, so a caller without the
secret cannot learn which ids exist. Only a caller holding a genuine secret hears more (a
disabled node, a credential of another role).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gantry.common import tokens
from gantry.common.auth import Principal, Role
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform import credentials
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.state_machines import NodeState

log = logging.getLogger(__name__)

_KINDS = {
    Role.OPERATOR: tokens.OPERATOR_TOKEN,
    Role.CLIENT: tokens.API_KEY,
    Role.WORKER: tokens.NODE_CREDENTIAL,
}


@dataclass(frozen=True, slots=True)
class _CachedKey:
    key_hash: str
    tenant_id: str
    expires_at: float


class ControlPlaneAuthenticator:
    # Client keys are checked on every inference call; a short cache keeps the database off that
    # hot path. A revoked key stops working within this many seconds (at once on the replica that
    # revoked it: `forget_api_key`).
    CLIENT_KEY_CACHE_SECONDS = 5.0
    # A key in use is read again this long before its entry expires, in the background, while the
    # entry still answers; and callers that find it expired share one read. Measured (issue 29,
    # 32 clients on one key): when the entry expired, every call in flight missed at once and each
    # read the database itself (24 to 64 reads every 5 s); one caller paid the read on its own
    # path once every 5 s. The refresh changes no freshness: an entry answers only until it
    # expires, and a revocation here still forgets it at once.
    CLIENT_KEY_REFRESH_AHEAD_S = 1.0

    def __init__(self, database: Database, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self._client_keys: dict[str, _CachedKey] = {}
        # api key id -> the one read of it in flight, shared by every caller that needs it.
        self._key_reads: dict[str, asyncio.Task[_CachedKey | None]] = {}
        # Bumped by each `forget_api_key`: a read that started before may not fill the cache.
        self._forgets = 0

    async def close(self) -> None:
        """Stop the key reads still in flight (the control plane stops, its database closes)."""
        reads = list(self._key_reads.values())
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)

    async def authenticate(self, role: Role, token: str) -> Principal:
        kind = _KINDS.get(role)
        parsed = tokens.parse_token(token, kind=kind) if kind else None
        if parsed is None:
            other = next(
                (
                    r
                    for r, k in _KINDS.items()
                    if r is not role and tokens.parse_token(token, kind=k)
                ),
                None,
            )
            if other is not None:
                # A genuine credential of another role is known but not allowed here; a forged one
                # is simply not known (the call below raises UNAUTHENTICATED for it).
                await self.authenticate(other, token)
                raise GantryError(
                    "PERMISSION_DENIED",
                    f"{_article(other.value)} {other.value} credential cannot make "
                    f"{role.value} calls",
                    role=role.value,
                )
            raise GantryError(
                "UNAUTHENTICATED",
                f"this call needs {_article(role.value)} {role.value} token, and the bearer token "
                "given is not one (malformed, or of an unknown kind)",
            )
        if role is Role.CLIENT:
            return await self._client(token, parsed.token_id)
        async with self._database.read() as session:
            if role is Role.OPERATOR:
                row = await credentials.find_operator_token(session, parsed.token_id)
                if row is None or row.revoked_at is not None:
                    raise _refused(role)
                stored, subject = row.token_hash, row.token_id
            else:
                node = await session.get(nodes.Node, parsed.token_id)
                if node is None or node.deleted_at is not None:
                    raise _refused(role)
                stored, subject = node.credential_hash, node.node_id
                if node.state == NodeState.DISABLED and tokens.token_matches(token, stored):
                    raise GantryError("NODE_DISABLED", f"node {node.node_id} is disabled")
        if not tokens.token_matches(token, stored):
            raise _refused(role)
        return Principal(role=role, subject=subject)

    def forget_api_key(self, api_key_id: str) -> None:
        """A revoked key must not live on in the cache: the next call reads the database (a read
        already in flight answers only the calls that were waiting for it)."""
        self._forgets += 1
        self._client_keys.pop(api_key_id, None)
        self._key_reads.pop(api_key_id, None)

    async def _client(self, token: str, api_key_id: str) -> Principal:
        now = self._clock.monotonic()
        cached = self._client_keys.get(api_key_id)
        if cached is None or cached.expires_at < now:
            read = self._key_reads.get(api_key_id) or self._read_key(api_key_id)
            cached = await asyncio.shield(read)
        elif (
            cached.expires_at - now < self.CLIENT_KEY_REFRESH_AHEAD_S
            and api_key_id not in self._key_reads
        ):
            self._read_key(api_key_id)  # answered from the entry; the read refreshes it
        if cached is None or not tokens.token_matches(token, cached.key_hash):
            raise _refused(Role.CLIENT)
        return Principal(role=Role.CLIENT, subject=cached.tenant_id)

    def _read_key(self, api_key_id: str) -> asyncio.Task[_CachedKey | None]:
        """Start the one read of a key, as a task of its own: a caller that goes away while it
        waits (shielded) does not cancel it for the others."""
        read = asyncio.create_task(self._key_row(api_key_id, self._forgets), name="api-key-read")
        self._key_reads[api_key_id] = read

        def done(task: asyncio.Task[_CachedKey | None]) -> None:
            if self._key_reads.get(api_key_id) is task:
                del self._key_reads[api_key_id]
            if not task.cancelled() and task.exception() is not None:
                # A refresh nobody waits for: the entry expires in its time and the next call's
                # own read reports the failure to its caller.
                log.debug("api key %s not read: %s", api_key_id, task.exception())

        read.add_done_callback(done)
        return read

    async def _key_row(self, api_key_id: str, forgets: int) -> _CachedKey | None:
        """The key's entry as the database has it now (None: unknown or revoked), cached unless
        a key was forgotten since the read began."""
        started = self._clock.monotonic()
        async with self._database.read() as session:
            row = await credentials.find_api_key(session, api_key_id)
        current = forgets == self._forgets
        if row is None or row.revoked_at is not None:
            if current:
                self._client_keys.pop(api_key_id, None)
            return None
        cached = _CachedKey(
            key_hash=row.key_hash,
            tenant_id=row.tenant_id,
            expires_at=started + self.CLIENT_KEY_CACHE_SECONDS,
        )
        if current:
            self._client_keys[api_key_id] = cached
        return cached


def _refused(role: Role) -> GantryError:
    """The one refusal for a credential of the right kind that is not accepted: its wording
    must not depend on whether the id exists, was revoked or deleted, or the secret was wrong."""
    return GantryError(
        "UNAUTHENTICATED",
        f"{_article(role.value)} {role.value} credential is required and the one given is "
        "not valid",
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
