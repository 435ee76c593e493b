"""Identifiers minted where records are created: UUID strings, and the 63-bit worker generations
the control plane issues."""

from __future__ import annotations

import secrets
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


# The largest generation: it fits a signed BIGINT column in every database we run on.
GENERATION_LIMIT = 2**63 - 1
# How far past the stored generation the next one lands, at most: random, so a credential holder
# cannot name the generation the real worker holds and join it (it can only take a new one).
GENERATION_STEP = 1 << 16


def next_generation(current: int) -> int:
    """The generation the control plane issues after `current` (issue 26, item 6).

    Issued, never chosen by the worker: a Hello claims the node for `current` + 1..STEP in one
    conditional UPDATE (nodes/store.py `claim_generation`), so no worker can name a generation
    "from the future" that fences the next one out. A new value is always larger, so anything
    stamped with an older one is fenced.
    """
    generation = current + 1 + secrets.randbelow(GENERATION_STEP)
    if generation > GENERATION_LIMIT:
        raise OverflowError(f"generation {current} has no successor below 2**63")
    return generation
