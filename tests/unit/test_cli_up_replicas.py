"""`gantry up --control-planes N`: the plan of processes and ports, the children's flags, the
`control-planes` file and the banner (pure: ports come from a counter, nothing is started).

The running thing is tests/integration/test_cli_up_replicas.py.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from gantry.cli.connection import read_control_planes
from gantry.cli.state import StatePaths
from gantry.cli.up import METRICS_ADDRESSES, UpSettings, banner, child_specs
from gantry.cli.up_plan import (
    control_planes_file,
    plan_processes,
    redact,
    replica_database_url,
)
from gantry.common.errors import GantryError

POSTGRES = "postgresql+asyncpg://gantry@db.internal:5432/gantry"


def no_free_port() -> int:
    raise AssertionError("one replica needs no free port")


def plan(control_planes: int, *, metrics: bool = True, http: str | None = "127.0.0.1:8080"):
    ports = itertools.count(41000)
    return plan_processes(
        control_planes=control_planes,
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        http_address=http,
        metrics_addresses=METRICS_ADDRESSES if metrics else None,
        free_port=lambda: next(ports),
    )


def settings_for(tmp_path: Path, control_planes: int) -> UpSettings:
    return UpSettings(
        paths=StatePaths(tmp_path / "state"),
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
        metrics=True,
        http_address="127.0.0.1:8080",
        control_planes=control_planes,
        database_url=POSTGRES if control_planes > 1 else None,
    )


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_replica_is_todays_processes_on_the_addresses_given() -> None:
    one = plan_processes(
        control_planes=1,
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        http_address="127.0.0.1:8080",
        metrics_addresses=METRICS_ADDRESSES,
        free_port=no_free_port,
    )
    assert [(s.name, s.address, s.metrics_address) for s in one.schedulers] == [
        ("scheduler", "127.0.0.1:50052", "127.0.0.1:9465")
    ]
    [replica] = one.control_planes
    assert (replica.name, replica.address, replica.http_address, replica.metrics_address) == (
        "controlplane",
        "127.0.0.1:50051",
        "127.0.0.1:8080",
        "127.0.0.1:9464",
    )
    assert (one.scheduler_addresses, one.control_plane_addresses) == (
        "127.0.0.1:50052",
        "127.0.0.1:50051",
    )


def test_further_replicas_and_a_standby_scheduler_take_distinct_free_ports() -> None:
    three = plan(3)
    assert [s.name for s in three.schedulers] == ["scheduler", "scheduler-2"]
    assert [c.name for c in three.control_planes] == [
        "controlplane",
        "controlplane-2",
        "controlplane-3",
    ]
    first = three.control_planes[0]
    assert (first.address, first.http_address, first.metrics_address) == (
        "127.0.0.1:50051",
        "127.0.0.1:8080",
        "127.0.0.1:9464",
    )
    assert three.schedulers[0].address == "127.0.0.1:50052"
    taken = [
        address
        for listener in three.listeners()
        for address in (listener.address, listener.http_address, listener.metrics_address)
        if address is not None
    ]
    assert len(taken) == len(set(taken)) == 2 * 2 + 3 * 3  # grpc+metrics; grpc+http+metrics
    assert three.control_plane_addresses.split(",") == [c.address for c in three.control_planes]
    assert three.scheduler_addresses.split(",") == [s.address for s in three.schedulers]


def test_further_replicas_listen_on_the_first_ones_host_and_serve_only_what_it_serves() -> None:
    ports = itertools.count(41000)
    quiet = plan_processes(
        control_planes=2,
        address="0.0.0.0:50051",
        scheduler_address="127.0.0.1:50052",
        http_address=None,
        metrics_addresses=None,
        free_port=lambda: next(ports),
    )
    second = quiet.control_planes[1]
    assert second.address.startswith("0.0.0.0:")
    assert (second.http_address, second.metrics_address) == (None, None)
    assert all(s.metrics_address is None for s in quiet.schedulers)


def test_every_replica_is_told_both_schedulers_and_the_worker_every_replica(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path, 2)
    two = plan(2)
    specs = child_specs(settings, two)
    assert list(specs) == ["scheduler", "scheduler-2", "controlplane", "controlplane-2", "worker"]
    for replica in two.control_planes:
        argv = list(specs[replica.name].argv)
        assert option(argv, "--listen") == replica.address
        assert option(argv, "--scheduler") == two.scheduler_addresses
        assert option(argv, "--database-url") == POSTGRES
        assert option(argv, "--http-listen") == replica.http_address
        assert option(argv, "--metrics-address") == replica.metrics_address
    worker = list(specs["worker"].argv)
    assert option(worker, "--control-plane") == two.control_plane_addresses
    assert option(list(specs["scheduler-2"].argv), "--listen") == two.schedulers[1].address
    logs = {spec.log_path.name for spec in specs.values()}
    assert logs == {f"{name}.log" for name in specs}  # one log per process, none shared


def test_the_file_lists_every_replica_in_order_as_the_cli_reads_it(tmp_path: Path) -> None:
    for count in (1, 3):
        planned = plan(count)
        path = tmp_path / f"control-planes-{count}"
        path.write_text(control_planes_file(planned))
        assert read_control_planes(path) == planned.control_plane_addresses


def test_the_banner_lists_every_replicas_grpc_and_http_address(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 2)
    two = plan(2)
    shown = banner(settings, "d-1", plan=two)
    for replica in two.control_planes:
        assert f"  control plane  {replica.address}  (" in shown
        assert f"  OpenAI API     http://{replica.http_address}/v1  (" in shown
    assert f"  scheduler      {two.schedulers[0].address}, {two.schedulers[1].address}" in shown
    assert "logs/{scheduler,scheduler-2,controlplane,controlplane-2,worker}.log" in shown
    assert "gantry.db" not in shown  # the replicas' database is PostgreSQL's
    one = banner(dataclasses.replace(settings, control_planes=1, database_url=None), "d-1")
    assert one.count("  control plane  ") == 1 and "gantry.db" in one


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://gantry@db/gantry", "postgresql+asyncpg://gantry@db/gantry"),
        ("postgres://gantry@db/gantry", "postgresql+asyncpg://gantry@db/gantry"),
        (POSTGRES, POSTGRES),
    ],
)
def test_several_replicas_take_a_postgresql_url_a_bare_one_meaning_asyncpg(
    url: str, expected: str
) -> None:
    assert replica_database_url(2, url) == expected


@pytest.mark.parametrize(
    "url", [None, "sqlite+aiosqlite:///tmp/gantry.db", "mysql://gantry@db/gantry"]
)
def test_several_replicas_without_postgresql_are_refused(url: str | None) -> None:
    with pytest.raises(GantryError) as raised:
        replica_database_url(2, url)
    assert raised.value.reason == "INVALID_ARGUMENT"
    assert "--control-planes 2 needs --database-url postgresql://" in raised.value.message


def test_one_replica_takes_any_database_or_none() -> None:
    assert replica_database_url(1, None) is None
    assert replica_database_url(1, "sqlite+aiosqlite:///x.db") == "sqlite+aiosqlite:///x.db"
    with pytest.raises(GantryError, match="not a URL"):
        replica_database_url(1, "db.internal")


def test_a_password_in_the_url_is_never_printed() -> None:
    assert (
        redact("postgresql+asyncpg://gantry:hunter2@db/g") == "postgresql+asyncpg://gantry:***@db/g"
    )
    assert redact(POSTGRES) == POSTGRES


def test_up_refuses_several_replicas_on_sqlite_in_one_line_before_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gantry.cli.up as up
    from gantry.cli.main import main

    started: list[UpSettings] = []
    monkeypatch.setattr(up, "run_up", lambda settings: started.append(settings) or 0)
    state = str(tmp_path / "state")
    assert main(["--state-dir", state, "up", "--control-planes", "2"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: INVALID_ARGUMENT: --control-planes 2 needs --database-url")
    assert started == []
    with pytest.raises(SystemExit) as usage:  # at least one: a usage error, exit status 2
        main(["--state-dir", state, "up", "--control-planes", "0"])
    assert usage.value.code == 2
    assert (
        main(["--state-dir", state, "up", "--control-planes", "2", "--database-url", POSTGRES]) == 0
    )
    [settings] = started
    assert (settings.control_planes, settings.database) == (2, POSTGRES)
