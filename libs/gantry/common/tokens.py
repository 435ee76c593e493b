"""Secrets: 256-bit random tokens shown once, stored as SHA-256 hashes, compared in constant time.

A token reads `<kind>_<id>_<secret>`: the id finds the stored hash without scanning, the secret is
never stored. Tokens are high-entropy random values, so a fast hash is the right tool (no password
stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

NODE_CREDENTIAL = "gnc"
OPERATOR_TOKEN = "gop"
API_KEY = "gak"
LEASE_TOKEN = "gls"
SERVICE_TOKEN = "gsv"


@dataclass(frozen=True, slots=True)
class ParsedToken:
    kind: str
    token_id: str
    secret: str


def mint_token(kind: str, token_id: str) -> str:
    return f"{kind}_{token_id}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_token(token: str, *, kind: str) -> ParsedToken | None:
    """Split a presented token; None when it is not of the expected kind or shape."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != kind or not parts[1] or not parts[2]:
        return None
    return ParsedToken(kind=parts[0], token_id=parts[1], secret=parts[2])


def token_matches(presented: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_token(presented).encode(), stored_hash.encode())
