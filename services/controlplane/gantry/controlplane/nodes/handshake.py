"""A worker stream's opening, decided apart from the stream (gateway.py applies it): the checks a
Hello passes before anything of it is kept, what the node's row keeps of it, and the Welcome that
answers it. Pure: no IO."""

from __future__ import annotations

import datetime as dt
from typing import Any

from google.protobuf import duration_pb2, json_format

from gantry.common.errors import GantryError
from gantry.controlplane.nodes.capabilities import domains_to_json, gpus_to_json
from gantry.controlplane.nodes.inventory import Reconciled
from gantry.controlplane.nodes.wire_bounds import check_worker_message
from gantry.v1 import worker_gateway_pb2 as wg


def check_hello(first: wg.WorkerMessage, node_id: str) -> None:
    """A stream's first message, refused before anything of it is read, kept or logged: within
    the protocol's bounds (wire_bounds.py, INVALID_ARGUMENT naming the field), a Hello, and for
    the node the credential names."""
    check_worker_message(first)
    if first.WhichOneof("kind") != "hello":
        raise GantryError("INVALID_ARGUMENT", "the first message on a worker stream is Hello")
    if first.node_id and first.node_id != node_id:
        raise GantryError("PERMISSION_DENIED", "Hello names another node than the credential")


def node_inventory(hello: wg.Hello) -> dict[str, Any]:
    """What a Hello says the node offers, as its row keeps it."""
    adapters = sorted({a for env in hello.environments for a in env.adapters})
    return {
        "adapters": adapters,
        # What the node offers placement: the scheduler's ledger charges these.
        "domains": domains_to_json(hello.resource_domains),
        # The worker's bound on model hosts: placement sends it no more (0: not said).
        "max_residents": hello.max_residents,
        "inventory": json_format.MessageToDict(hello.inventory),
        "environments": [json_format.MessageToDict(e) for e in hello.environments],
        # What an operator's GPU constraints match: its GPUs by model and compute capability.
        "gpu_devices": gpus_to_json(hello.gpus),
    }


def welcome(
    node_id: str, generation: int, reconciled: Reconciled, *, heartbeat_interval_s: float
) -> wg.Welcome:
    """The answer to an accepted Hello: what was adopted, what to unload, how often to beat."""
    return wg.Welcome(
        node_id=node_id,
        accepted_generation=generation,
        heartbeat_interval=interval(heartbeat_interval_s),
        adopted_deployment_ids=reconciled.adopted,
        unload_deployment_ids=reconciled.unwanted,
        # Heartbeat.gpus_unchanged is taken on this stream (StreamReading).
        gpu_reading_unchanged_understood=True,
        # WorkerMessage.batch is read on this stream (gateway.py, `_read`).
        worker_batches_understood=True,
    )


def interval(seconds: float) -> duration_pb2.Duration:
    interval = duration_pb2.Duration()
    interval.FromTimedelta(dt.timedelta(seconds=seconds))
    return interval
