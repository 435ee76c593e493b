"""The pure rules of which scheduler every control-plane replica uses (one active among several)."""

from __future__ import annotations

import pytest

from gantry.controlplane.platform.scheduler_assignment_rules import (
    Assignment,
    active_failed,
    choose,
    moved,
    parse_addresses,
    probe_order,
    reassign_reason,
)

ADDRESSES = ("a:1", "b:2", "c:3")


def test_addresses_are_an_ordered_list_without_gaps_or_repeats() -> None:
    assert parse_addresses("a:1") == ("a:1",)
    assert parse_addresses(" a:1, b:2 ,c:3") == ADDRESSES
    with pytest.raises(ValueError, match="empty address"):
        parse_addresses("a:1,,b:2")
    with pytest.raises(ValueError, match="empty address"):
        parse_addresses("")
    with pytest.raises(ValueError, match="a:1 more than once"):
        parse_addresses("a:1,b:2,a:1")


def test_only_a_link_that_takes_no_request_and_heard_nothing_for_the_timeout_has_failed() -> None:
    assert active_failed(connected=False, silent_for_s=3.0, silence_timeout_s=3.0)
    # Back within the timeout (a restart): it keeps its place.
    assert not active_failed(connected=False, silent_for_s=2.9, silence_timeout_s=3.0)
    # Slow pings but requests taken: not failed.
    assert not active_failed(connected=True, silent_for_s=10.0, silence_timeout_s=3.0)


def test_the_leader_names_another_only_when_none_is_named_it_is_unlisted_or_it_failed() -> None:
    named = Assignment("b:2", 4)
    assert reassign_reason(ADDRESSES, named, failed=False, silent_for_s=0.0) is None
    assert reassign_reason(ADDRESSES, Assignment(), failed=False, silent_for_s=0.0) == (
        "no scheduler is named yet"
    )
    unlisted = reassign_reason(ADDRESSES, Assignment("z:9", 4), failed=False, silent_for_s=0.0)
    assert unlisted is not None and "z:9 is not among" in unlisted
    failed = reassign_reason(ADDRESSES, named, failed=True, silent_for_s=3.25)
    assert failed == "the scheduler at b:2 has not answered for 3.2s"


def test_candidates_are_the_ones_after_the_current_wrapping_round_never_itself() -> None:
    assert probe_order(ADDRESSES, "a:1") == ("b:2", "c:3")
    assert probe_order(ADDRESSES, "b:2") == ("c:3", "a:1")
    assert probe_order(ADDRESSES, "c:3") == ("a:1", "b:2")
    assert probe_order(ADDRESSES, "") == ADDRESSES
    assert probe_order(ADDRESSES, "z:9") == ADDRESSES
    assert probe_order(("a:1",), "a:1") == ()


def test_the_first_candidate_that_answered_is_chosen_and_the_epoch_moves_on() -> None:
    order = probe_order(ADDRESSES, "a:1")
    assert choose(order, {"b:2": True, "c:3": True}) == "b:2"
    assert choose(order, {"b:2": False, "c:3": True}) == "c:3"
    assert choose(order, {"a:1": True, "b:2": False}) is None  # the failed one is no candidate
    assert choose((), {}) is None
    assert moved(Assignment("a:1", 7), "c:3") == Assignment("c:3", 8)
    assert moved(Assignment(), "a:1") == Assignment("a:1", 1)
