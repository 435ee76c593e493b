"""`gantry tenants` and `gantry queue` against a fake control plane served over real gRPC: a policy
read whole and sent back with the flags applied, every page listed, an unknown tenant refused in
one line, and the queue snapshot printed as JSON, rendered, or watched through a failed fetch.

The parsing, merging and rendering are tested in tests/unit/test_cli_tenants_queue.py; these serve
gRPC on a port, which the unit guard refuses.
"""

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
from gantry.cli.main import main
from gantry.cli.queue_commands import CLEAR_SCREEN, render_queue_snapshot
from gantry.common.client_config import RETRY_POLICY
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, scheduler_pb2
from tests.unit.test_cli_tenants_queue import INTERACTIVE, OPERATOR_TOKEN, SNAPSHOT


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


def test_queue_watch_keeps_drawing_through_a_failed_fetch(
    running: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt
        # The second fetch fails: every attempt of it (a read answered UNAVAILABLE is retried,
        # gantry.common.client_config), so the watch has a failed fetch to draw through.
        failing = int(RETRY_POLICY["maxAttempts"]) if len(naps) == 1 else 0
        running.fake.snapshot_failures = failing

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
