"""What every unary inference operation's control-plane binding gives InferenceService: a
checked request as the worker payload to send, its cost, its span's attributes, and how the
worker's result is checked and shaped into the client's response (operations.py binds one
`Prepare` per operation)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from gantry.common.inference_limits import InferenceLimits
from gantry.controlplane.nodes.sessions import InvokePayload
from gantry.v1 import worker_gateway_pb2 as wg

# Shapes the worker's result into the client's response (its deployment and node left unset);
# raises INVOKE_FAILED for a result that disagrees with the request.
Answer = Callable[[wg.InvokeResult], Message]


@dataclass(frozen=True, kw_only=True)
class PreparedCall:
    """A checked request, ready to send: what the worker gets and how its answer comes back."""

    payload: InvokePayload
    cost: int  # the work's size for the fair queue (work_cost.py)
    attributes: Mapping[str, str | int | float]  # on the call's span, beside the tenant
    answer: Answer


# The client's request and the server's input limits -> the call to send; raises the client's
# error (INVALID_PAYLOAD, INPUT_TOO_LONG, ...) before anything is scheduled.
Prepare = Callable[[Any, InferenceLimits], PreparedCall]
