"""The metrics seam: bounded labels, bad addresses refused, and `gantry up` turning the endpoints
on (or off). What it installs in a fresh interpreter: tests/integration/test_metrics_seam.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.cli.state import StatePaths
from gantry.cli.up import METRICS_ADDRESSES, UpSettings, banner, child_specs
from gantry.common.metrics import OTHER, BoundedValues, MetricsAddressError, parse_address


def test_bounded_values_keep_the_first_values_and_fold_the_rest_into_other():
    labels = BoundedValues(50)
    seen = {labels(f"tenant-{index}") for index in range(1000)}
    assert len(seen) == 51
    assert OTHER in seen
    assert {labels(f"tenant-{index}") for index in range(50)} == {
        f"tenant-{index}" for index in range(50)
    }
    assert labels("tenant-999") == OTHER  # still folded on a second sight
    assert len(labels) == 50


def test_bounded_values_refuse_a_limit_below_one():
    with pytest.raises(ValueError):
        BoundedValues(0)


@pytest.mark.parametrize("address", ["9464", "127.0.0.1", ":9464", "127.0.0.1:port", "h:99999"])
def test_a_malformed_metrics_address_names_the_flag(address: str):
    with pytest.raises(MetricsAddressError, match="--metrics-address"):
        parse_address(address)


def test_ipv6_and_any_port_addresses_parse():
    assert parse_address("[::1]:9464") == ("::1", 9464)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)


def _up_settings(tmp_path: Path, *, metrics: bool) -> UpSettings:
    return UpSettings(
        paths=StatePaths(tmp_path / "state"),
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
        metrics=metrics,
    )


def test_up_gives_each_service_its_metrics_address_and_prints_where(tmp_path: Path):
    settings = _up_settings(tmp_path, metrics=True)
    specs = child_specs(settings)
    for role, address in METRICS_ADDRESSES.items():
        argv = specs[role].argv
        assert argv[argv.index("--metrics-address") + 1] == address
    shown = banner(settings, "deployment-1")
    assert "http://127.0.0.1:9464/metrics" in shown and "http://127.0.0.1:9466/metrics" in shown
    quiet = _up_settings(tmp_path, metrics=False)
    assert not any("--metrics-address" in spec.argv for spec in child_specs(quiet).values())
    assert "metrics        off" in banner(quiet, "deployment-1")


@pytest.mark.parametrize(("flags", "expected"), [([], True), (["--no-metrics"], False)])
def test_up_turns_metrics_on_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: bool
):
    import gantry.cli.up as up
    from gantry.cli.main import main

    chosen: list[UpSettings] = []
    monkeypatch.setattr(up, "run_up", lambda settings: chosen.append(settings) or 0)
    assert main(["--state-dir", str(tmp_path / "state"), "up", *flags]) == 0
    assert [settings.metrics for settings in chosen] == [expected]
