"""`gantry tenants` and `gantry queue`: their arguments, `set` merging flags into the current
policy, and the queue snapshot as an operator reads it (a pure rendering of a hand-built one).
The commands against a fake control plane over real gRPC:
tests/integration/test_cli_tenants_queue_served.py."""

from __future__ import annotations

import pytest

from gantry.cli.main import build_parser
from gantry.cli.queue_commands import CLEAR_SCREEN, render_queue_snapshot, watch
from gantry.cli.tenant_commands import PolicyChanges, merged_policy, parse_priorities
from gantry.v1 import common_pb2, scheduler_pb2

OPERATOR_TOKEN = "gantry_operator_test"
INTERACTIVE = common_pb2.PRIORITY_INTERACTIVE
BATCH = common_pb2.PRIORITY_BATCH
GIB = 1024**3

SNAPSHOT = scheduler_pb2.QueueSnapshot(
    control_plane_connected=True,
    queued=4,
    in_flight=3,
    dispatched_total=120,
    rejected_total=7,
    expired_total=1,
    tenants=[
        scheduler_pb2.TenantLoad(
            tenant_id="gold",
            weight=3,
            queued=3,
            in_flight=2,
            served_total=90,
            served_cost=9000,
            served_share=0.75,
            weight_share=0.75,
            rejected_total=2,
            budget_used=9000,
            budget_units=50_000,
        ),
        scheduler_pb2.TenantLoad(
            tenant_id="free",
            weight=1,
            queued=1,
            in_flight=1,
            served_total=30,
            served_share=0.25,
            weight_share=0.25,
            rejected_total=5,
            budget_used=3000,
        ),
    ],
    ledger=[
        scheduler_pb2.DomainLedger(
            node_id="node-1",
            domain=common_pb2.ResourceDomain(
                name="gpu0.vram",
                kind=common_pb2.RESOURCE_KIND_VRAM,
                capacity_bytes=80_000_000_000,
                safety_margin_bytes=2_000_000_000,
            ),
            requested_bytes=30_000_000_000,
            reserved_bytes=20_000_000_000,
            available_bytes=58_000_000_000,
        ),
        scheduler_pb2.DomainLedger(
            node_id="node-2",
            domain=common_pb2.ResourceDomain(
                name="unified",
                kind=common_pb2.RESOURCE_KIND_UNIFIED,
                capacity_bytes=128_000_000_000,
            ),
            available_bytes=0,
            blocked_reason="residency r-9 is UNCERTAIN",
        ),
    ],
    breakers=[
        scheduler_pb2.BreakerView(
            node_id="node-1",
            deployment_id="dep-1",
            state=scheduler_pb2.BREAKER_STATE_OPEN,
            consecutive_failures=3,
            cooldown_left_seconds=12.5,
        ),
        scheduler_pb2.BreakerView(
            node_id="node-2", state=scheduler_pb2.BREAKER_STATE_CLOSED, consecutive_failures=0
        ),
    ],
    advice=[
        scheduler_pb2.ScaleAdvice(
            deployment_id="dep-1",
            current_replicas=1,
            desired_replicas=3,
            reason="queue depth 4 over 1 replica",
        )
    ],
)


# ---- arguments ----------------------------------------------------------------------------------


def test_bare_tenants_lists_and_each_subcommand_reaches_its_handler() -> None:
    parser = build_parser()
    assert parser.parse_args(["tenants"]).handler.__name__ == "tenants_list"
    assert parser.parse_args(["tenants", "list"]).handler.__name__ == "tenants_list"
    show = parser.parse_args(["tenants", "show", "gold"])
    assert (show.handler.__name__, show.tenant_id) == ("tenants_show", "gold")


def test_set_flags_become_changes_and_unnamed_flags_stay_unset() -> None:
    args = build_parser().parse_args(
        [
            "tenants",
            "set",
            "gold",
            "--weight",
            "3",
            "--budget-window",
            "120",
            "--priorities",
            "batch",
        ]
    )
    assert args.handler.__name__ == "tenants_set"
    assert (args.tenant_id, args.weight, args.budget_window, args.priorities) == (
        "gold",
        3,
        120,
        (BATCH,),
    )
    assert (args.max_queue_depth, args.max_concurrency, args.budget) == (None, None, None)


@pytest.mark.parametrize(
    "argv",
    [
        ["tenants", "set", "gold", "--weight", "-1"],
        ["tenants", "set", "gold", "--budget", "lots"],
        ["tenants", "set", "gold", "--priorities", "urgent"],
        ["tenants", "set", "gold", "--priorities", "batch,batch"],
        ["queue", "--watch", "0"],
    ],
)
def test_malformed_flags_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2


def test_priorities_parse_in_any_case_and_order() -> None:
    assert parse_priorities("Interactive, BATCH") == (INTERACTIVE, BATCH)
    assert parse_priorities("batch,interactive") == (BATCH, INTERACTIVE)


def test_queue_watch_takes_an_optional_interval() -> None:
    parser = build_parser()
    assert parser.parse_args(["queue"]).watch is None
    assert parser.parse_args(["queue", "--watch"]).watch == 2.0
    watched = parser.parse_args(["queue", "--watch", "0.5", "--json"])
    assert (watched.watch, watched.output) == (0.5, "json")


# ---- merging ------------------------------------------------------------------------------------


def test_set_changes_only_the_named_fields_of_the_current_policy() -> None:
    current = common_pb2.TenantPolicy(
        tenant_id="gold",
        weight=3,
        max_queue_depth=100,
        max_concurrency=10,
        budget_units=5000,
        budget_window_seconds=60,
        allowed_priorities=[INTERACTIVE, BATCH],
    )
    merged = merged_policy(current, PolicyChanges(max_concurrency=0, allowed_priorities=(BATCH,)))
    assert merged == common_pb2.TenantPolicy(
        tenant_id="gold",
        weight=3,
        max_queue_depth=100,
        max_concurrency=0,  # an explicit 0 is a change (back to the default), not "unset"
        budget_units=5000,
        budget_window_seconds=60,
        allowed_priorities=[BATCH],
    )
    assert current.max_concurrency == 10 and list(current.allowed_priorities) == [1, 2]


def test_no_changes_is_empty_and_merges_to_the_same_policy() -> None:
    current = common_pb2.TenantPolicy(tenant_id="gold", weight=2)
    assert PolicyChanges().empty
    assert not PolicyChanges(weight=0).empty
    assert merged_policy(current, PolicyChanges()) == current


# ---- rendering and watching ---------------------------------------------------------------------


def section(lines: list[str], title: str) -> list[str]:
    """The table lines under a section title, its header first, up to the blank line."""
    start = lines.index(title) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


def test_the_snapshot_renders_totals_shares_ledger_breakers_and_advice() -> None:
    lines = render_queue_snapshot(SNAPSHOT).splitlines()
    assert lines[0] == "scheduler  connected to the control plane"
    assert lines[1] == (
        "work       4 queued, 3 in flight; 120 dispatched, 7 rejected, 1 expired,"
        " 0 cancelled, 0 infra failures"
    )
    header, gold, free = section(lines, "TENANTS")
    assert header.split()[-2:] == ["REJECTED", "BUDGET(USED/LIMIT)"]
    assert gold.split() == ["gold", "3", "3", "2", "90", "75.0%", "/", "75.0%", "2", "9000/50000"]
    assert free.split()[-3:] == ["25.0%", "5", "3000/unlimited"]

    header, node_1, node_2 = section(lines, "LEDGER")
    assert header.split() == [
        "NODE", "DOMAIN", "KIND", "CAPACITY", "MARGIN", "REQUESTED", "RESERVED", "AVAILABLE",
        "BLOCKED",
    ]  # fmt: skip
    assert node_1.split() == [
        "node-1", "gpu0.vram", "VRAM", "80.0", "GB", "2.0", "GB", "30.0", "GB", "20.0", "GB",
        "58.0", "GB", "-",
    ]  # fmt: skip
    assert node_2.split()[:3] == ["node-2", "unified", "UNIFIED"]
    assert node_2.endswith("0 B        residency r-9 is UNCERTAIN")

    _, open_breaker, node_breaker = section(lines, "BREAKERS")
    assert open_breaker.split() == ["node-1", "dep-1", "OPEN", "3", "12.5s"]
    assert node_breaker.split() == ["node-2", "(node)", "CLOSED", "0", "-"]
    _, advice = section(lines, "AUTOSCALE ADVICE")
    assert advice.split() == ["dep-1", "1", "3", "queue", "depth", "4", "over", "1", "replica"]


def test_an_empty_snapshot_says_so_in_every_section() -> None:
    text = render_queue_snapshot(scheduler_pb2.QueueSnapshot())
    assert text.splitlines()[0] == "scheduler  NOT connected to the control plane"
    for title in ("TENANTS", "LEDGER", "RESIDENCIES", "BREAKERS", "AUTOSCALE ADVICE"):
        assert f"\n{title}\nnone" in text


def test_every_residency_shows_its_slots_in_use_and_its_breaker() -> None:
    snapshot = scheduler_pb2.QueueSnapshot(
        residencies=[
            scheduler_pb2.ResidencyLoad(
                residency_id="r-1",
                deployment_id="dep-1",
                node_id="node-1",
                state=common_pb2.RESIDENCY_STATE_RESIDENT,
                in_flight=3,
                slots=4,
                infra_failures=1,
                breaker=scheduler_pb2.BREAKER_STATE_HALF_OPEN,
            )
        ]
    )
    _, row = section(render_queue_snapshot(snapshot).splitlines(), "RESIDENCIES")
    assert row.split() == ["r-1", "dep-1", "node-1", "RESIDENT", "3/4", "1", "HALF_OPEN"]


def test_watch_redraws_each_frame_on_a_clear_screen_and_ends_cleanly_on_ctrl_c() -> None:
    frames = iter(["frame 1", "frame 2"])
    written: list[str] = []
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    assert watch(lambda: next(frames), interval_s=1.5, write=written.append, sleep=sleep) == 0
    assert written == [f"{CLEAR_SCREEN}frame 1\n", f"{CLEAR_SCREEN}frame 2\n"]
    assert naps == [1.5, 1.5]
