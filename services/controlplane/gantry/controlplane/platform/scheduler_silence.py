"""How the control plane tells a silent scheduler from a busy one (scheduler_link.py's silence
rule): a health check on the stream's own channel every third of the silence timeout, each with
that deadline. Only a ping that timed out or found no transport counts as unanswered; any other
ending, even an error status, shows that the process runs. What silence does to the link's
requests is the link's (`SchedulerLink._fell_silent`, `_heard`)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# How long a ping may go unanswered before the scheduler counts as SILENT (docs/limits.md).
DEFAULT_SILENCE_TIMEOUT_SECONDS = 3.0
# Pings per silence timeout: silence is noticed within 4/3 of the timeout at the latest.
_PINGS_PER_SILENCE_TIMEOUT = 3
# A ping that ends so says nothing came back from the process: any other answer, even an error
# status (a server without the health service says UNIMPLEMENTED), shows that it is running.
_UNANSWERED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


class Liveness(enum.Enum):
    """Whether the scheduler answers: kept across reconnects, so a stream reopened to a process
    that is still stopped takes no request before it has answered a ping."""

    ANSWERING = "ANSWERING"
    SILENT = "SILENT"  # a ping went unanswered: requests are refused SCHEDULER_UNAVAILABLE


def ping_answered(code: grpc.StatusCode) -> bool:
    """Whether a ping that ended with `code` was answered by the scheduler process."""
    return code not in _UNANSWERED


async def watch_silence(
    scheduler_channel: grpc.aio.Channel,
    timeout_s: float,
    *,
    heard: Callable[[], None],
    fell_silent: Callable[[grpc.StatusCode], None],
) -> None:
    """Ping the scheduler over the stream's own channel until cancelled (the stream ended),
    telling `heard` of each answered ping and `fell_silent` of each unanswered one."""
    health = health_pb2_grpc.HealthStub(scheduler_channel)
    interval = timeout_s / _PINGS_PER_SILENCE_TIMEOUT
    while True:
        try:
            await health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            code = error.code()
        if ping_answered(code):
            heard()
        else:
            fell_silent(code)
        await asyncio.sleep(interval)
