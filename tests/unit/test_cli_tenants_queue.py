"""`gantry tenants` and `gantry queue`: their arguments, `set` merging flags into the current
policy, and the queue snapshot as an operator reads it (a pure rendering of a hand-built one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from gantry.cli import queue_commands
from gantry.cli.main import build_parser, main
from gantry.cli.queue_commands import CLEAR_SCREEN, render_queue_snapshot, watch
from gantry.cli.tenant_commands import PolicyChanges, merged_policy, parse_priorities
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, scheduler_pb2

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


# ---- the commands against a fake control plane ---------------------------------------------------


@dataclass
class FakeTenants(control_plane_pb2_grpc.ControlPlaneServicer):
    policies: dict[str, common_pb2.TenantPolicy] = field(default_factory=dict)
    sets: list[common_pb2.TenantPolicy] = field(default_factory=list)
    snapshot: scheduler_pb2.QueueSnapshot = field(default_factory=lambda: SNAPSHOT)
    snapshot_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _authorize(self, context: grpc.ServicerContext) -> None:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {OPERATOR_TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "operator token required")

    def GetTenantPolicy(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context)
        with self.lock:
            if request.tenant_id not in self.policies:
                context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {request.tenant_id!r} not found")
            return self.policies[request.tenant_id]

    def SetTenantPolicy(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context)
        with self.lock:
            self.sets.append(request.policy)
            self.policies[request.policy.tenant_id] = request.policy
            return request.policy

    def ListTenants(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context)
        with self.lock:
            ordered = sorted(self.policies.values(), key=lambda p: p.tenant_id)
        start = int(request.page_token or 0)
        page = ordered[start : start + 1]  # pages of one: the CLI must follow the token
        more = start + 1 < len(ordered)
        return control_plane_pb2.ListTenantsResponse(
            tenants=page, next_page_token=str(start + 1) if more else ""
        )

    def GetQueueSnapshot(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context)
        with self.lock:
            failing, self.snapshot_failures = self.snapshot_failures > 0, self.snapshot_failures - 1
        if failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is restarting")
        return self.snapshot


@dataclass
class Running:
    fake: FakeTenants
    address: str
    state: Path

    def gantry(self, *argv: str) -> int:
        return main(["--address", self.address, "--state-dir", str(self.state), *argv])


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "operator.token").write_text(OPERATOR_TOKEN + "\n")
    fake = FakeTenants()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield Running(fake, f"127.0.0.1:{port}", tmp_path)
    finally:
        server.stop(None)


def test_tenants_set_reads_the_current_policy_and_sends_it_whole_with_the_flags_applied(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.fake.policies["gold"] = common_pb2.TenantPolicy(
        tenant_id="gold", weight=3, max_queue_depth=100, budget_units=5000, budget_window_seconds=60
    )
    assert running.gantry("tenants", "set", "gold", "--max-concurrency", "8", "--budget", "0") == 0
    assert running.fake.sets == [
        common_pb2.TenantPolicy(
            tenant_id="gold",
            weight=3,
            max_queue_depth=100,
            max_concurrency=8,
            budget_units=0,
            budget_window_seconds=60,
        )
    ]
    out = capsys.readouterr().out
    assert "max concurrency  8" in out
    assert "budget           unlimited" in out


def test_tenants_set_on_an_unknown_tenant_starts_from_the_defaults(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert running.gantry("tenants", "set", "new", "--weight", "2") == 0
    assert running.fake.sets == [common_pb2.TenantPolicy(tenant_id="new", weight=2)]


def test_tenants_set_without_a_flag_changes_nothing_and_says_why(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert running.gantry("tenants", "set", "gold") == 1
    assert "nothing to set" in capsys.readouterr().err
    assert running.fake.sets == []


def test_tenants_lists_every_page_and_show_prints_one(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.fake.policies["gold"] = common_pb2.TenantPolicy(
        tenant_id="gold",
        weight=3,
        max_queue_depth=100,
        max_concurrency=8,
        budget_units=5000,
        budget_window_seconds=60,
        allowed_priorities=[INTERACTIVE],
    )
    running.fake.policies["free"] = common_pb2.TenantPolicy(
        tenant_id="free", weight=1, budget_window_seconds=60
    )
    assert running.gantry("tenants") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TENANT", "WEIGHT", "DEPTH", "QUOTA", "BUDGET/WINDOW", "PRIORITIES"]
    assert lines[1].split() == ["free", "1", "default", "default", "unlimited", "interactive,batch"]
    assert lines[2].split() == ["gold", "3", "100", "8", "5000/60s", "interactive"]

    assert running.gantry("tenants", "show", "gold") == 0
    assert capsys.readouterr().out.splitlines() == [
        "tenant           gold",
        "weight           3",
        "max queue depth  100",
        "max concurrency  8",
        "budget           5000 cost units per 60s",
        "priorities       interactive",
    ]


def test_tenants_show_of_an_unknown_tenant_fails_in_one_line(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert running.gantry("tenants", "show", "nobody") == 1
    assert capsys.readouterr().err.strip() == "error: NOT_FOUND: tenant 'nobody' not found"


def test_queue_json_is_the_snapshot_itself(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert running.gantry("queue", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["tenants"][0]["tenant_id"] == "gold"  # the proto's names, as grpcurl prints
    assert json_format.ParseDict(printed, scheduler_pb2.QueueSnapshot()) == SNAPSHOT


def test_queue_prints_the_rendered_snapshot(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert running.gantry("queue") == 0
    assert capsys.readouterr().out == render_queue_snapshot(SNAPSHOT) + "\n"


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


def test_queue_watch_keeps_drawing_through_a_failed_fetch(
    running: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt
        running.fake.snapshot_failures = 1 if len(naps) == 1 else 0  # the second fetch fails

    monkeypatch.setattr(queue_commands, "time", SimpleNamespace(sleep=sleep))
    assert running.gantry("queue", "--watch", "0.25") == 0
    frames = capsys.readouterr().out.split(CLEAR_SCREEN)[1:]
    assert len(frames) == 3
    assert "scheduler  connected to the control plane" in frames[0]
    assert frames[1].strip() == (
        "error: UNAVAILABLE: the scheduler is restarting"
        f" (is `gantry up` running at {running.address}?)"
    )
    assert "scheduler  connected to the control plane" in frames[2]
    assert naps == [0.25, 0.25, 0.25]
