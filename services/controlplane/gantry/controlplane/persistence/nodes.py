"""Node records: registration with a hashed credential, connection state, the current generation."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common import tokens
from gantry.common.errors import GantryError, not_found
from gantry.common.ids import new_id
from gantry.controlplane.domain.transitions import NodeState
from gantry.controlplane.persistence.models import Node
from gantry.controlplane.persistence.transitions import compare_and_set


async def register_node(
    session: AsyncSession, *, name: str, labels: dict[str, str], now: dt.datetime
) -> tuple[Node, str]:
    """A new node and its credential; the credential is returned once, only its hash is stored."""
    existing = await session.scalar(select(Node).where(Node.name == name))
    if existing is not None:
        raise GantryError("ALREADY_EXISTS", f"a node named {name!r} exists", name=name)
    node_id = new_id()
    credential = tokens.mint_token(tokens.NODE_CREDENTIAL, node_id)
    node = Node(
        node_id=node_id,
        name=name,
        credential_hash=tokens.hash_token(credential),
        state=NodeState.REGISTERED,
        generation=0,
        labels=labels,
        hostname="",
        inventory={},
        created_at=now,
    )
    session.add(node)
    await session.flush()
    return node, credential


async def get_node(session: AsyncSession, node_id: str) -> Node:
    node = await session.get(Node, node_id)
    if node is None:
        raise not_found("node", node_id)
    return node


async def list_nodes(session: AsyncSession, *, after: str, limit: int) -> Sequence[Node]:
    query = select(Node).where(Node.node_id > after).order_by(Node.node_id).limit(limit)
    return (await session.scalars(query)).all()


async def mark_connected(
    session: AsyncSession,
    node: Node,
    *,
    generation: int,
    hostname: str,
    inventory: dict[str, Any],
    now: dt.datetime,
) -> None:
    if node.state != NodeState.CONNECTED:
        await compare_and_set(
            session,
            Node,
            node.node_id,
            machine="node",
            expected=node.state,
            target=NodeState.CONNECTED,
        )
    node.generation = generation
    node.hostname = hostname
    node.inventory = inventory
    node.last_seen_at = now
    await session.flush()


async def mark_disconnected(
    session: AsyncSession, node_id: str, *, generation: int, now: dt.datetime
) -> bool:
    """Only the generation that holds the node may mark it gone (a newer one may be connected)."""
    node = await get_node(session, node_id)
    if node.generation != generation or node.state != NodeState.CONNECTED:
        return False
    await compare_and_set(
        session,
        Node,
        node_id,
        machine="node",
        expected=NodeState.CONNECTED,
        target=NodeState.DISCONNECTED,
        last_seen_at=now,
    )
    return True


async def disconnect_all(session: AsyncSession, *, now: dt.datetime) -> int:
    """At control-plane start no worker stream exists yet: CONNECTED rows are stale."""
    rows = (await session.scalars(select(Node).where(Node.state == NodeState.CONNECTED))).all()
    for row in rows:
        await compare_and_set(
            session,
            Node,
            row.node_id,
            machine="node",
            expected=NodeState.CONNECTED,
            target=NodeState.DISCONNECTED,
        )
    return len(rows)
