"""Tenant policy rules: what an operator may set, normalised once, so every stored policy is valid.

Pure (protobuf values in and out, no grpc, no database). The defaults the proto documents are
applied here and nowhere else: weight 0 means 1, a budget window of 0 means 60 seconds, and no
allowed priorities means both. A refusal is INVALID_ARGUMENT naming the field, raised before any
state is touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gantry.common.errors import invalid_argument
from gantry.controlplane.platform.validation import _check_name
from gantry.v1 import common_pb2

DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000
MAX_QUEUE_DEPTH = 100_000
MAX_CONCURRENCY = 100_000
# budget_units is a uint64 on the wire but lives in a signed 64-bit column.
MAX_BUDGET_UNITS = 2**63 - 1
DEFAULT_BUDGET_WINDOW_SECONDS = 60
MAX_BUDGET_WINDOW_SECONDS = 86_400
SETTABLE_PRIORITIES = frozenset({common_pb2.PRIORITY_INTERACTIVE, common_pb2.PRIORITY_BATCH})


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantPolicySettings:
    """One tenant's checked policy. 0 for a depth or quota is the scheduler's default; 0 budget
    units is unlimited; no allowed priorities is both."""

    tenant_id: str
    weight: int = DEFAULT_WEIGHT
    max_queue_depth: int = 0
    max_concurrency: int = 0
    budget_units: int = 0
    budget_window_seconds: int = DEFAULT_BUDGET_WINDOW_SECONDS
    allowed_priorities: tuple[int, ...] = ()  # sorted, distinct Priority values


def check_tenant_id(value: str, *, field: str = "tenant_id") -> str:
    """The rule CreateApiKey applies to the tenant it creates."""
    return _check_name(value, field=field)


def check_tenant_policy(policy: common_pb2.TenantPolicy) -> TenantPolicySettings:
    """The whole policy of a SetTenantPolicyRequest, checked and with its defaults applied."""
    return TenantPolicySettings(
        tenant_id=check_tenant_id(policy.tenant_id, field="policy.tenant_id"),
        weight=_at_most(policy.weight or DEFAULT_WEIGHT, MAX_WEIGHT, field="policy.weight"),
        max_queue_depth=_at_most(
            policy.max_queue_depth, MAX_QUEUE_DEPTH, field="policy.max_queue_depth"
        ),
        max_concurrency=_at_most(
            policy.max_concurrency, MAX_CONCURRENCY, field="policy.max_concurrency"
        ),
        budget_units=_at_most(policy.budget_units, MAX_BUDGET_UNITS, field="policy.budget_units"),
        budget_window_seconds=_at_most(
            policy.budget_window_seconds or DEFAULT_BUDGET_WINDOW_SECONDS,
            MAX_BUDGET_WINDOW_SECONDS,
            field="policy.budget_window_seconds",
        ),
        allowed_priorities=check_allowed_priorities(
            policy.allowed_priorities, field="policy.allowed_priorities"
        ),
    )


def check_allowed_priorities(values: Iterable[int], *, field: str) -> tuple[int, ...]:
    """INTERACTIVE and BATCH only, each at most once; sorted so equal policies compare equal."""
    seen: list[int] = []
    for value in values:
        if value not in SETTABLE_PRIORITIES:
            raise invalid_argument(
                f"{field} may hold only PRIORITY_INTERACTIVE and PRIORITY_BATCH, got {value}",
                field=field,
            )
        if value in seen:
            raise invalid_argument(f"{field} names priority {value} twice", field=field)
        seen.append(value)
    return tuple(sorted(seen))


def policy_message(settings: TenantPolicySettings) -> common_pb2.TenantPolicy:
    return common_pb2.TenantPolicy(
        tenant_id=settings.tenant_id,
        weight=settings.weight,
        max_queue_depth=settings.max_queue_depth,
        max_concurrency=settings.max_concurrency,
        budget_units=settings.budget_units,
        budget_window_seconds=settings.budget_window_seconds,
        allowed_priorities=[common_pb2.Priority.ValueType(p) for p in settings.allowed_priorities],
    )


def audit_detail(settings: TenantPolicySettings) -> dict[str, str]:
    """The policy as an audit event records it: one string per field."""
    return {
        "weight": str(settings.weight),
        "max_queue_depth": str(settings.max_queue_depth),
        "max_concurrency": str(settings.max_concurrency),
        "budget_units": str(settings.budget_units),
        "budget_window_seconds": str(settings.budget_window_seconds),
        "allowed_priorities": ",".join(
            common_pb2.Priority.Name(p) for p in settings.allowed_priorities
        ),
    }


def _at_most(value: int, limit: int, *, field: str) -> int:
    if value > limit:
        raise invalid_argument(f"{field} must be at most {limit}", field=field, limit=str(limit))
    return value
