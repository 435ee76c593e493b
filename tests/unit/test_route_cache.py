"""The control plane's short-lived capability -> deployment cache."""

from __future__ import annotations

import asyncio

import pytest

from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import DeploymentResolver
from gantry.v1 import inference_pb2
from tests.waiting import poll


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


class _GatedResolver(DeploymentResolver):
    """The binding read is held open until the test lets it finish; reads are counted."""

    def __init__(self, routes: RouteCache) -> None:
        super().__init__(database=None, routes=routes)  # type: ignore[arg-type]
        self.reads = 0
        self.gate = asyncio.Event()
        self.answer: str | Exception = "d1"

    async def _read_binding(self, capability: str, epoch: int) -> str:
        self.reads += 1
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        self._routes.put(capability, self.answer, epoch=epoch)
        return self.answer


def _request(capability: str = "minilm") -> inference_pb2.EmbedRequest:
    return inference_pb2.EmbedRequest(capability=capability, inputs=["x"])


async def _started(resolver: _GatedResolver, count: int) -> list[asyncio.Task[str]]:
    tasks = [asyncio.create_task(resolver.resolve(_request())) for _ in range(count)]
    # The first caller's read is under way; the others, started in the same turn, share it.
    await poll(lambda: resolver.reads == 1, 5, "the first caller's binding read")
    return tasks


async def test_concurrent_misses_of_one_capability_share_one_binding_read():
    resolver = _GatedResolver(RouteCache(ManualClock()))
    tasks = await _started(resolver, 10)
    resolver.gate.set()
    assert await asyncio.gather(*tasks) == ["d1"] * 10
    assert resolver.reads == 1


async def test_a_caller_arriving_after_a_clear_does_not_join_a_read_started_before_it():
    routes = RouteCache(ManualClock())
    resolver = _GatedResolver(routes)
    early = await _started(resolver, 1)
    routes.routing_changing()  # a binding move commits: the read in flight may be stale
    routes.routing_changed()
    late = await _started(resolver, 1)
    resolver.gate.set()
    await asyncio.gather(*early, *late)
    assert resolver.reads == 2


async def test_a_failed_read_answers_everyone_who_waited_on_it():
    resolver = _GatedResolver(RouteCache(ManualClock()))
    resolver.answer = GantryError("NOT_FOUND", "no deployment is bound")
    tasks = await _started(resolver, 3)
    resolver.gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert [getattr(outcome, "reason", None) for outcome in outcomes] == ["NOT_FOUND"] * 3
    assert resolver.reads == 1


async def test_when_the_reading_caller_goes_away_the_others_read_again_and_are_answered():
    resolver = _GatedResolver(RouteCache(ManualClock()))
    leader, *followers = await _started(resolver, 3)
    leader.cancel()
    await poll(lambda: resolver.reads == 2, 5, "a follower reading the binding again")
    resolver.gate.set()
    assert await asyncio.gather(*followers) == ["d1", "d1"]
    assert leader.cancelled()
    assert resolver.reads == 2  # the cancelled read, then one shared by both followers


def _route_aged(seconds: float) -> tuple[ManualClock, RouteCache, _GatedResolver]:
    """A route to d1 with a 1 s life, `seconds` after it was read; its resolver's reads gated."""
    clock = ManualClock()
    routes = RouteCache(clock, ttl_seconds=1.0)
    resolver = _GatedResolver(routes)
    routes.put("minilm", "d1")
    clock.advance(seconds)
    return clock, routes, resolver


async def test_a_route_in_use_is_read_again_before_it_expires_while_the_call_is_answered():
    clock, routes, resolver = _route_aged(0.5)
    assert await resolver.resolve(_request()) == "d1"
    assert resolver.reads == 0  # not yet due: half its life left
    clock.advance(0.3)  # inside REFRESH_AHEAD_S of its expiry
    resolver.answer = "d2"  # the binding moved on meanwhile
    # Answered from the entry while the read runs (its gate is shut): nobody waits for it.
    assert await resolver.resolve(_request()) == "d1"
    await poll(lambda: resolver.reads == 1, 5, "the refresh's read")
    assert await resolver.resolve(_request()) == "d1"
    assert resolver.reads == 1  # one refresh, however many calls find the route due
    resolver.gate.set()
    await poll(lambda: routes.get("minilm") == "d2", 5, "the refreshed route")
    clock.advance(0.5)  # past the first entry's expiry: the refreshed one still answers
    assert await resolver.resolve(_request()) == "d2"
    assert resolver.reads == 1


async def test_a_refresh_that_finds_the_route_gone_drops_it_and_the_next_call_is_told():
    _, routes, resolver = _route_aged(0.9)
    resolver.answer = GantryError("NOT_FOUND", "no deployment is bound")
    resolver.gate.set()
    assert await resolver.resolve(_request()) == "d1"  # the entry is still within its life
    await poll(lambda: routes.get("minilm") is None, 5, "the route dropped by its refresh")
    with pytest.raises(GantryError) as told:
        await resolver.resolve(_request())
    assert told.value.reason == "NOT_FOUND"
    assert resolver.reads == 2


async def test_closing_the_resolver_stops_a_refresh_in_flight():
    _, routes, resolver = _route_aged(0.9)
    assert await resolver.resolve(_request()) == "d1"
    await poll(lambda: resolver.reads == 1, 5, "the refresh's read")
    await resolver.close()  # the gate is never opened: the read is cancelled, not awaited
    assert routes.get("minilm") == "d1"  # nothing was put by the cancelled read
