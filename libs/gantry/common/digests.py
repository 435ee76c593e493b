"""Digests both sides of a worker stream compute the same way: exact adoption compares them."""

from __future__ import annotations

import hashlib
import json

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def adapter_digest(adapter: common_pb2.AdapterSettings) -> str:
    """sha256 of the deterministic bytes of the adapter settings a host was started with."""
    return hashlib.sha256(adapter.SerializeToString(deterministic=True)).hexdigest()


def environment_fingerprint(environment: wg.RuntimeEnvironment) -> str:
    """sha256 over an environment's id, interpreter and package versions (sorted)."""
    canonical = json.dumps(
        {
            "environment_id": environment.environment_id,
            "python_executable": environment.python_executable,
            "versions": dict(sorted(environment.versions.items())),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
