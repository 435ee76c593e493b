"""The tenant policy rules: every policy within the limits is accepted with its defaults applied,
checking is idempotent, and anything past a limit is refused naming exactly its field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.common.errors import GantryError
from gantry.controlplane.tenants.policy_rules import (
    MAX_BUDGET_UNITS,
    MAX_BUDGET_WINDOW_SECONDS,
    MAX_CONCURRENCY,
    MAX_QUEUE_DEPTH,
    MAX_WEIGHT,
    TenantPolicySettings,
    check_tenant_policy,
    policy_message,
)
from gantry.v1 import common_pb2

INTERACTIVE = common_pb2.PRIORITY_INTERACTIVE
BATCH = common_pb2.PRIORITY_BATCH

valid_policies = st.builds(
    common_pb2.TenantPolicy,
    tenant_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    weight=st.integers(0, MAX_WEIGHT),
    max_queue_depth=st.integers(0, MAX_QUEUE_DEPTH),
    max_concurrency=st.integers(0, MAX_CONCURRENCY),
    budget_units=st.integers(0, MAX_BUDGET_UNITS),
    budget_window_seconds=st.integers(0, MAX_BUDGET_WINDOW_SECONDS),
    allowed_priorities=st.sampled_from(
        [[], [INTERACTIVE], [BATCH], [INTERACTIVE, BATCH], [BATCH, INTERACTIVE]]
    ),
)


@settings(max_examples=200, deadline=None)
@given(valid_policies)
def test_a_policy_within_the_limits_is_accepted_normalised_and_checks_the_same_again(
    policy: common_pb2.TenantPolicy,
) -> None:
    checked = check_tenant_policy(policy)
    assert checked.weight == (policy.weight or 1)
    assert checked.budget_window_seconds == (policy.budget_window_seconds or 60)
    assert checked.allowed_priorities == tuple(sorted(policy.allowed_priorities))
    assert check_tenant_policy(policy_message(checked)) == checked


def test_an_empty_policy_is_the_default_one() -> None:
    assert check_tenant_policy(common_pb2.TenantPolicy(tenant_id="t")) == TenantPolicySettings(
        tenant_id="t", weight=1, budget_window_seconds=60, allowed_priorities=()
    )


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("policy.tenant_id", {"tenant_id": ""}),
        ("policy.tenant_id", {"tenant_id": "-leading-dash"}),
        ("policy.tenant_id", {"tenant_id": "x" * 129}),
        ("policy.weight", {"weight": MAX_WEIGHT + 1}),
        ("policy.max_queue_depth", {"max_queue_depth": MAX_QUEUE_DEPTH + 1}),
        ("policy.max_concurrency", {"max_concurrency": MAX_CONCURRENCY + 1}),
        ("policy.budget_units", {"budget_units": MAX_BUDGET_UNITS + 1}),
        ("policy.budget_window_seconds", {"budget_window_seconds": MAX_BUDGET_WINDOW_SECONDS + 1}),
        ("policy.allowed_priorities", {"allowed_priorities": [INTERACTIVE, INTERACTIVE]}),
        ("policy.allowed_priorities", {"allowed_priorities": [common_pb2.PRIORITY_UNSPECIFIED]}),
        ("policy.allowed_priorities", {"allowed_priorities": [7]}),
    ],
)
def test_a_policy_past_a_limit_is_refused_naming_its_field(
    field: str, changes: dict[str, object]
) -> None:
    fields: dict[str, object] = {"tenant_id": "t", **changes}
    with pytest.raises(GantryError) as refused:
        check_tenant_policy(common_pb2.TenantPolicy(**fields))  # type: ignore[arg-type]
    assert (refused.value.reason, refused.value.metadata["field"]) == ("INVALID_ARGUMENT", field)
