"""The control plane's short-lived capability -> deployment cache."""

from __future__ import annotations

from gantry.common.clock import ManualClock
from gantry.controlplane.route_cache import RouteCache


def test_a_route_expires_after_its_ttl():
    clock = ManualClock()
    cache = RouteCache(clock, ttl_seconds=1.0)
    cache.put("minilm", "d1")
    assert cache.get("minilm") == "d1"
    clock.advance(0.9)
    assert cache.get("minilm") == "d1"
    clock.advance(0.2)
    assert cache.get("minilm") is None


def test_clear_forgets_every_route():
    cache = RouteCache(ManualClock())
    cache.put("a", "d1")
    cache.put("b", "d2")
    cache.clear()
    assert (cache.get("a"), cache.get("b")) == (None, None)
