"""Node records: registration with a hashed credential, connection state, the current generation,
and the worker streams each control-plane replica holds (`node_streams`: a node is connected while
some replica's row of its generation is fresh)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Select, Update, bindparam, delete, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common import tokens
from gantry.common.errors import GantryError, not_found
from gantry.common.ids import new_id, next_generation
from gantry.controlplane.jobs.store import OPEN_JOB_STATES
from gantry.controlplane.nodes.liveness import SeenBatch
from gantry.controlplane.observability import state_history
from gantry.controlplane.platform.models import Node, NodeStream, ServingJob
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.platform.state_machines import NodeState
from gantry.controlplane.platform.transitions import (
    compare_and_set,
    compare_and_set_many,
    lost_a_race,
)

# Nodes per `record_last_seen` statement: far below SQLite's and PostgreSQL's bind limits.
LAST_SEEN_CHUNK = 5_000


async def register_node(
    session: AsyncSession, *, name: str, labels: dict[str, str], now: dt.datetime
) -> tuple[Node, str]:
    """A new node and its credential; the credential is returned once, only its hash is stored."""
    # A deleted node keeps its row (and name) for its history: the name is free again.
    existing = await session.scalar(
        select(Node).where(Node.name == name, Node.deleted_at.is_(None))
    )
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
    await state_history.add_created(
        session, node, subject_kind="node", subject_id=node_id, state=node.state, at=now
    )
    return node, credential


async def get_node(session: AsyncSession, node_id: str) -> Node:
    return await get_row(session, Node, node_id, "node")


async def list_nodes(
    session: AsyncSession, *, after: str, limit: int, include_deleted: bool = False
) -> Sequence[Node]:
    """Nodes by id; deleted ones only when asked (placement, snapshots and the scheduler's view
    never see them)."""
    query = select(Node).where(Node.node_id > after)
    if not include_deleted:
        query = query.where(Node.deleted_at.is_(None))
    return (await session.scalars(query.order_by(Node.node_id).limit(limit))).all()


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
        await _move_node(session, node, NodeState.CONNECTED, now=now)
    node.generation = generation
    node.hostname = hostname
    node.inventory = inventory
    node.last_seen_at = now
    await session.flush()


async def mark_disconnected(
    session: AsyncSession,
    locked: Iterable[Node],
    ends: Collection[tuple[str, int]],
    *,
    now: dt.datetime,
) -> set[str]:
    """Those of the `locked` nodes (`lock_nodes`) that `ends` (node id, generation) mark
    DISCONNECTED, in one compare-and-set: only the generation that holds a node may mark it
    gone (a newer one may be connected)."""
    ended = set(ends)
    marked = sorted(
        node.node_id
        for node in locked
        if (node.node_id, node.generation) in ended and node.state == NodeState.CONNECTED
    )
    await compare_and_set_many(
        session,
        Node,
        marked,
        machine="node",
        expected=NodeState.CONNECTED,
        target=NodeState.DISCONNECTED,
        last_seen_at=now,
    )
    return set(marked)


async def disconnect_all(
    session: AsyncSession, *, now: dt.datetime, held: Mapping[str, Collection[int]] | None = None
) -> int:
    """At control-plane start no worker stream exists here yet: CONNECTED rows are stale, but
    for those whose generation another replica still holds (`held`: `held_by_others`)."""
    rows = (await session.scalars(select(Node).where(Node.state == NodeState.CONNECTED))).all()
    disconnected = 0
    for row in rows:
        if row.generation in (held or {}).get(row.node_id, ()):
            continue
        try:
            await compare_and_set(
                session,
                Node,
                row.node_id,
                machine="node",
                expected=NodeState.CONNECTED,
                target=NodeState.DISCONNECTED,
                now=now,
            )
        except GantryError as error:
            # A previous control plane's last goodbye (still committing as it shuts down) moved
            # the row first: it is no longer CONNECTED, which is all this start needs.
            if not lost_a_race(error):
                raise
            continue
        disconnected += 1
    return disconnected


async def claim_generation(
    session: AsyncSession,
    node_id: str,
    *,
    presented: int,
    hostname: str,
    inventory: dict[str, Any],
    now: dt.datetime,
) -> tuple[Node, int]:
    """Claim the node for a generation the control plane issues; (the node, the one it replaced).

    `presented`: the generation the Hello names (the one last issued to it, or 0). Kept when it
    is the node's current one: the same process reconnecting, its leases, residents and unacked
    results still valid. Otherwise the next is issued (`generation_to_claim`), so the newest Hello
    wins and nothing a worker chooses fences the next Hello out. One conditional UPDATE on the
    generation read: of two racing Hellos one wins, the other is refused STALE_GENERATION.
    """
    found = (
        await session.execute(select(Node.state, Node.generation).where(Node.node_id == node_id))
    ).one_or_none()
    if found is None:
        raise not_found("node", node_id)
    previous_state, stored = found
    generation = generation_to_claim(stored=stored, presented=presented)
    result = await session.execute(
        update(Node)
        .where(
            Node.node_id == node_id,
            Node.generation == stored,
            Node.state != NodeState.DISABLED,
            # DeleteNode locks the row: a Hello racing it either lands first (and the delete is
            # refused: CONNECTED) or waits and matches nothing here.
            Node.deleted_at.is_(None),
        )
        .values(
            state=NodeState.CONNECTED,
            generation=generation,
            hostname=hostname,
            inventory=inventory,
            last_seen_at=now,
        )
        .execution_options(synchronize_session="fetch")
    )
    node = await get_node(session, node_id)
    await session.refresh(node)
    if result.rowcount == 1:  # type: ignore[attr-defined]
        if previous_state != NodeState.CONNECTED:
            await state_history.record_changes(
                session,
                Node,
                [node_id],
                machine="node",
                from_state=previous_state,
                to_state=NodeState.CONNECTED,
                values={},
                at=now,
            )
        return node, stored
    raise _claim_refused(node)


def generation_to_claim(*, stored: int, presented: int) -> int:
    """The generation a Hello claims: the one it presents when that is the stored one (the same
    process reconnecting), else the next one issued. Never one the worker chose."""
    return stored if presented and presented == stored else next_generation(stored)


def _claim_refused(node: Node) -> GantryError:
    """Why a Hello's conditional UPDATE matched nothing."""
    if node.deleted_at is not None:
        return GantryError("UNAUTHENTICATED", f"node {node.node_id} was deleted")
    if node.state == NodeState.DISABLED:
        return GantryError(
            "NODE_DISABLED", f"node {node.node_id} is disabled", node_id=node.node_id
        )
    return GantryError(
        "STALE_GENERATION",
        f"another Hello of node {node.node_id} claimed it first (generation {node.generation})",
        node_id=node.node_id,
    )


async def nodes_in_state(
    session: AsyncSession, state: NodeState, *, seen_before: dt.datetime | None = None
) -> Sequence[Node]:
    query = select(Node).where(Node.state == state, Node.deleted_at.is_(None))
    if seen_before is not None:
        query = query.where((Node.last_seen_at < seen_before) | (Node.last_seen_at.is_(None)))
    return (await session.scalars(query)).all()


@functools.cache
def _last_seen_statements() -> tuple[Update, Update, Select[str, int]]:
    """`record_last_seen`'s two updates and `generations_of`'s read, built once with the nodes
    and the time as parameters: the reconciler flushes every heartbeat interval, and building
    each statement and its cache key cost its event loop more than running it (issue 29)."""
    seen_at = bindparam("seen_at", type_=Node.last_seen_at.type)
    nodes_seen = (
        update(Node)
        .where(
            Node.node_id.in_(bindparam("node_ids", expanding=True)),
            (Node.last_seen_at.is_(None)) | (Node.last_seen_at < seen_at),
        )
        .values(last_seen_at=seen_at)
        .execution_options(synchronize_session=False)
    )
    streams_heard = (
        update(NodeStream)
        .where(
            NodeStream.replica_id == bindparam("of_replica"),
            NodeStream.node_id.in_(bindparam("node_ids", expanding=True)),
            NodeStream.heard_at < seen_at,
        )
        .values(heard_at=seen_at)
        .execution_options(synchronize_session=False)
    )
    generations = select(Node.node_id, Node.generation).where(
        Node.node_id.in_(bindparam("node_ids", expanding=True))
    )
    return nodes_seen, streams_heard, generations


async def record_last_seen(session: AsyncSession, batch: SeenBatch) -> None:
    """Write `last_seen_at = batch.seen_at` for the batch's nodes: one statement per
    `LAST_SEEN_CHUNK` nodes (a bound on bind parameters that both stores accept).

    A row only moves forward: a flush that lands after a disconnect or a newer generation's Hello
    wrote a later time changes nothing, so no generation check is needed here.
    """
    nodes_seen, streams_heard, _ = _last_seen_statements()
    for start in range(0, len(batch.node_ids), LAST_SEEN_CHUNK):
        chunk = list(batch.node_ids[start : start + LAST_SEEN_CHUNK])
        await session.execute(nodes_seen, {"node_ids": chunk, "seen_at": batch.seen_at})
        # The same time on this replica's stream rows: what other replicas judge it by.
        await session.execute(
            streams_heard,
            {"node_ids": chunk, "seen_at": batch.seen_at, "of_replica": batch.replica_id},
        )


async def generations_of(session: AsyncSession, node_ids: Sequence[str]) -> dict[str, int]:
    """Each node's current generation (one statement per `LAST_SEEN_CHUNK` nodes)."""
    *_, generations = _last_seen_statements()
    found: dict[str, int] = {}
    for start in range(0, len(node_ids), LAST_SEEN_CHUNK):
        chunk = list(node_ids[start : start + LAST_SEEN_CHUNK])
        rows = await session.execute(generations, {"node_ids": chunk})
        found.update({node_id: generation for node_id, generation in rows})
    return found


async def record_stream(
    session: AsyncSession, *, node_id: str, replica_id: str, generation: int, now: dt.datetime
) -> None:
    """`replica_id` holds the node's stream of `generation` from now (its Hello). One row per
    node and replica: a reconnect to the same replica replaces its row."""
    await session.execute(
        delete(NodeStream).where(NodeStream.node_id == node_id, NodeStream.replica_id == replica_id)
    )
    session.add(
        NodeStream(node_id=node_id, replica_id=replica_id, generation=generation, heard_at=now)
    )
    await session.flush()


async def forget_streams(
    session: AsyncSession, *, replica_id: str, ends: Collection[tuple[str, int]]
) -> None:
    """`replica_id`'s streams that ended, each (node id, generation), in one statement (a newer
    generation's row of a node, if any, is kept)."""
    if ends:
        await session.execute(
            delete(NodeStream).where(
                NodeStream.replica_id == replica_id,
                tuple_(NodeStream.node_id, NodeStream.generation).in_(list(ends)),
            )
        )


async def held_elsewhere(
    session: AsyncSession,
    *,
    node_id: str,
    generation: int,
    replica_id: str,
    heard_since: dt.datetime,
) -> bool:
    """Whether another replica holds the node's stream of `generation`, heard since then."""
    held = await held_elsewhere_among(
        session, ends=[(node_id, generation)], replica_id=replica_id, heard_since=heard_since
    )
    return bool(held)


async def held_elsewhere_among(
    session: AsyncSession,
    *,
    ends: Collection[tuple[str, int]],
    replica_id: str,
    heard_since: dt.datetime,
) -> set[tuple[str, int]]:
    """Those of `ends` (node id, generation) whose stream another replica holds, heard since
    then: one statement however many."""
    if not ends:
        return set()
    rows = await session.execute(
        select(NodeStream.node_id, NodeStream.generation)
        .where(
            tuple_(NodeStream.node_id, NodeStream.generation).in_(list(ends)),
            NodeStream.replica_id != replica_id,
            NodeStream.heard_at >= heard_since,
        )
        .distinct()
    )
    return {(node_id, generation) for node_id, generation in rows}


async def held_by_others(
    session: AsyncSession, *, replica_id: str, heard_since: dt.datetime
) -> dict[str, set[int]]:
    """Node id -> the generations whose streams other replicas hold, heard since then."""
    rows = await session.execute(
        select(NodeStream.node_id, NodeStream.generation).where(
            NodeStream.replica_id != replica_id, NodeStream.heard_at >= heard_since
        )
    )
    held: dict[str, set[int]] = {}
    for node_id, generation in rows:
        held.setdefault(node_id, set()).add(generation)
    return held


def connected_anywhere(
    rows: Iterable[Node], *, here: Collection[str], held: Mapping[str, Collection[int]]
) -> set[str]:
    """The nodes among `rows` with a stream: one held here (`here`: node ids), or one of the
    row's generation another replica holds (`held`: `held_by_others`). Pure."""
    return {
        row.node_id
        for row in rows
        if row.node_id in here or row.generation in held.get(row.node_id, ())
    }


async def forget_silent_streams(session: AsyncSession, *, heard_before: dt.datetime) -> int:
    """Rows of streams not heard since then: a replica that died (no goodbye) left them."""
    result = await session.execute(delete(NodeStream).where(NodeStream.heard_at < heard_before))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def set_node_state(
    session: AsyncSession,
    node: Node,
    target: NodeState,
    *,
    now: dt.datetime | None = None,
    **values: Any,
) -> None:
    await _move_node(session, node, target, now=now, **values)
    await session.refresh(node)


async def _move_node(
    session: AsyncSession,
    node: Node,
    target: NodeState,
    *,
    now: dt.datetime | None,
    **values: Any,
) -> None:
    """One checked step of the node's machine from the state it was read in (not read back)."""
    await compare_and_set(
        session,
        Node,
        node.node_id,
        machine="node",
        expected=node.state,
        target=target,
        now=now,
        **values,
    )


async def rotate_credential(session: AsyncSession, node: Node) -> str:
    """A new credential for the node; only its hash is kept, the old one no longer matches."""
    credential = tokens.mint_token(tokens.NODE_CREDENTIAL, node.node_id)
    node.credential_hash = tokens.hash_token(credential)
    await session.flush()
    return credential


async def lock_node(session: AsyncSession, node_id: str) -> Node:
    """The node read under a row lock (PostgreSQL; SQLite's writers already take turns): a Hello
    racing a delete waits for it instead of slipping in between its checks and its write."""
    (node,) = await lock_nodes(session, [node_id])
    return node


async def lock_nodes(session: AsyncSession, node_ids: Collection[str]) -> list[Node]:
    """`lock_node` of each, in one statement, locked in node order (two writers locking
    overlapping sets then wait for each other instead of deadlocking); NOT_FOUND names the
    first missing."""
    wanted = sorted(set(node_ids))
    found = (
        await session.scalars(
            select(Node)
            .where(Node.node_id.in_(wanted))
            .order_by(Node.node_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    ).all()
    if len(found) != len(wanted):
        missing = sorted(set(wanted) - {node.node_id for node in found})
        raise not_found("node", missing[0])
    return list(found)


async def mark_deleted(session: AsyncSession, node: Node, *, now: dt.datetime) -> None:
    """Deleted: the row stays for its history. No token hashes to an empty string, so the
    credential it had matches nothing from now on (the authenticator refuses it first anyway)."""
    node.deleted_at = now
    node.credential_hash = ""
    await session.flush()


async def open_job_ids_on_node(session: AsyncSession, node_id: str) -> list[str]:
    """Jobs of any type still queued, leased or running on the node, oldest first."""
    query = (
        select(ServingJob.job_id)
        .where(ServingJob.node_id == node_id, ServingJob.state.in_(OPEN_JOB_STATES))
        .order_by(ServingJob.created_at, ServingJob.job_id)
    )
    return list((await session.scalars(query)).all())
