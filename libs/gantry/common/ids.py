"""Identifiers minted where records are created: UUID strings, and 64-bit worker generations."""

from __future__ import annotations

import secrets
import time
import uuid

from gantry.common.errors import invalid_argument


def new_id() -> str:
    return str(uuid.uuid4())


def parse_id(value: str, *, field: str) -> str:
    """A client-supplied id must be a UUID: a typed INVALID_ARGUMENT instead of a miss later."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise invalid_argument(f"{field} must be a UUID, got {value!r}", field=field) from None


_RANDOM_BITS = 8


def new_generation(*, now_ns: int | None = None) -> int:
    """A worker generation: microseconds since the epoch in the high bits, random low bits.

    Drawn once per worker process start. Later starts draw larger values (unless the clock jumps
    back), so the control plane can fence any message carrying a generation older than the one it
    recorded; the random bits keep two starts within one microsecond apart.
    """
    micros = (time.time_ns() if now_ns is None else now_ns) // 1000
    generation = (micros << _RANDOM_BITS) | secrets.randbits(_RANDOM_BITS)
    # 63 bits: the value fits a signed BIGINT column in every database we run on.
    return generation & 0x7FFF_FFFF_FFFF_FFFF


def generation_micros(generation: int) -> int:
    """When a generation was drawn (microseconds since the epoch), from its high bits."""
    return generation >> _RANDOM_BITS
