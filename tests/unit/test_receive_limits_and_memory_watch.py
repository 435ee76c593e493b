"""The control plane's gRPC receive limit follows what its doors legally take, and MemoryWatch
gives memory back only after growth (issue 26, item 4). Pure: no IO."""

from __future__ import annotations

from gantry.common.grpc_server import MESSAGE_LIMIT_BYTES, server_options
from gantry.common.inference_limits import (
    MAX_INPUTS_CEILING,
    MAX_REQUEST_BYTES_CEILING,
    InferenceLimits,
)
from gantry.controlplane.app import (
    TYPED_REFUSAL_MARGIN_BYTES,
    MemoryWatch,
    front_door_limits,
    receive_limit_bytes,
)
from gantry.controlplane.nodes.wire_bounds import worker_receive_limit_bytes
from gantry.controlplane.serving.inference_service import InferenceSettings

MIB = 1024 * 1024


def _limit(limits: InferenceLimits) -> int:
    settings = InferenceSettings(limits=limits)
    return receive_limit_bytes(settings, front_door_limits(settings))


def test_the_default_receive_limit_is_the_largest_legal_message_plus_the_typed_margin():
    limits = InferenceLimits()
    limit = _limit(limits)
    assert limit >= limits.largest_request_bytes
    assert limit >= worker_receive_limit_bytes(limits)
    assert limit == 41 * MIB + TYPED_REFUSAL_MARGIN_BYTES == 49 * MIB < MESSAGE_LIMIT_BYTES


def test_raised_limits_raise_the_receive_limit_with_them():
    raised = InferenceLimits(
        max_inputs=MAX_INPUTS_CEILING, max_request_bytes=MAX_REQUEST_BYTES_CEILING
    )
    limit = _limit(raised)
    assert limit >= raised.largest_request_bytes
    assert limit == worker_receive_limit_bytes(raised) + TYPED_REFUSAL_MARGIN_BYTES
    assert limit > _limit(InferenceLimits())


def test_every_interceptor_bound_fits_under_the_receive_limit():
    # A message the interceptor refuses with a typed INVALID_ARGUMENT must reach it.
    settings = InferenceSettings()
    bounds = front_door_limits(settings)
    limit = receive_limit_bytes(settings, bounds)
    assert all((bound.max_request_bytes or 0) <= limit for bound in bounds.values())


def test_server_options_carry_the_servers_own_receive_limit():
    options = dict(server_options(123_456))
    assert options["grpc.max_receive_message_length"] == 123_456
    assert options["grpc.max_send_message_length"] == MESSAGE_LIMIT_BYTES


def test_memory_is_given_back_only_past_the_growth_and_from_the_new_level():
    watch = MemoryWatch(settled=100 * MIB, growth=64 * MIB)
    assert not watch.observe(150 * MIB)
    assert watch.observe(170 * MIB)
    watch.given_back(120 * MIB)  # what was left after the trim is in use
    assert not watch.observe(180 * MIB)
    assert watch.observe(184 * MIB)


def test_memory_that_shrank_by_itself_lowers_the_level():
    watch = MemoryWatch(settled=100 * MIB, growth=64 * MIB)
    assert not watch.observe(80 * MIB)
    assert watch.observe(144 * MIB)
