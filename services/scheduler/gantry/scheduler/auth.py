"""The scheduler admits one caller: the control plane, holding the shared service token."""

from __future__ import annotations

from gantry.common import tokens
from gantry.common.auth import Principal, Role
from gantry.common.errors import GantryError


class ServiceTokenAuthenticator:
    def __init__(self, service_token: str) -> None:
        self._token_hash = tokens.hash_token(service_token)

    async def authenticate(self, role: Role, token: str) -> Principal:
        if role is not Role.SERVICE or not tokens.token_matches(token, self._token_hash):
            raise GantryError("UNAUTHENTICATED", "the service token is not valid")
        return Principal(role=Role.SERVICE, subject="controlplane")
