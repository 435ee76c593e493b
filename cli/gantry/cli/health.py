"""Waiting for a service to answer grpc.health.v1 SERVING (over TLS when given)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.cli.connection import open_channel
from gantry.cli.errors import CliError
from gantry.common.tls import ClientTls


def is_serving(address: str, *, timeout_s: float = 1.0, tls: ClientTls | None = None) -> bool:
    with open_channel(address, tls) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def log_tail(path: Path, *, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log yet)"
    tail = text.splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in tail) if tail else "(the log is empty)"


def wait_until_serving(
    address: str,
    *,
    role: str,
    log_path: Path,
    timeout_s: float,
    interval_s: float = 0.25,
    monotonic: Callable[[], float] = time.monotonic,
    tls: ClientTls | None = None,
) -> None:
    """Return once the service reports SERVING; fail naming the role and its log otherwise."""
    deadline = monotonic() + timeout_s
    with open_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet, or restarting: keep asking until the deadline
            if monotonic() >= deadline:
                raise CliError(
                    f"the {role} did not report SERVING on {address} within {timeout_s:g}s;"
                    f" see {log_path}. Its last lines:\n{log_tail(log_path)}"
                )
            time.sleep(interval_s)
