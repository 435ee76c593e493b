"""`gantry controlplane --scheduler` takes one address or an ordered list (one active at a time,
the next a standby), and the failover hold; a bad list exits 2 naming the flag."""

from __future__ import annotations

import os

import pytest

from gantry.controlplane import main as controlplane_settings
from gantry.controlplane.platform.scheduler_link import DEFAULT_FAILOVER_HOLD_SECONDS

TOKEN = ["--scheduler-token-file", "token"]


@pytest.fixture(autouse=True)
def _no_gantry_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GANTRY_"):
            monkeypatch.delenv(name)


def test_one_address_or_an_ordered_list_is_taken() -> None:
    one = controlplane_settings.read_settings(TOKEN)
    assert one.scheduler == "127.0.0.1:50052"
    assert one.scheduler_failover_hold_s == DEFAULT_FAILOVER_HOLD_SECONDS
    several = controlplane_settings.read_settings(
        [*TOKEN, "--scheduler", "sched-a:50052, sched-b:50052", "--scheduler-failover-hold-s", "2"]
    )
    assert several.scheduler == "sched-a:50052,sched-b:50052"
    assert several.scheduler_failover_hold_s == 2.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scheduler", "a:1,,b:2"], "--scheduler has an empty address in 'a:1,,b:2'"),
        (["--scheduler", "a:1,b:2,a:1"], "--scheduler names a:1 more than once"),
        (["--scheduler-failover-hold-s", "0"], "--scheduler-failover-hold-s must be positive"),
    ],
)
def test_a_bad_scheduler_setting_exits_2_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        controlplane_settings.read_settings([*TOKEN, *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
