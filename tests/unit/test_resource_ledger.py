"""The scheduler's resource ledger: domains, charges, replacement pairs and blocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.scheduler.policy.domains import demand_of
from gantry.scheduler.policy.ledger import Fit, Ledger
from gantry.scheduler.policy.types import Claim, Domain, ResourceKind

MIB = 1 << 20
GIB = 1 << 30
RAM = ResourceKind.RAM
VRAM = ResourceKind.VRAM
UNIFIED = ResourceKind.UNIFIED


def host_and_gpu(ram: int = 64 * GIB, vram: int = 80 * GIB, margin: int = 0) -> list[Domain]:
    return [
        Domain("host.ram", RAM, ram, margin=margin),
        Domain("gpu0.vram", VRAM, vram, margin=margin, device=0),
    ]


def ledger_with(node_id: str = "n", domains: list[Domain] | None = None) -> Ledger:
    ledger = Ledger()
    ledger.set_node(node_id, domains if domains is not None else host_and_gpu())
    return ledger


def test_a_charge_reserves_its_domains_and_release_returns_them():
    ledger = ledger_with()
    ledger.charge("r1", "n", [Claim(RAM, 2 * GIB), Claim(VRAM, 6 * GIB)])
    assert ledger.reserved("n", "host.ram") == 2 * GIB
    assert ledger.reserved("n", "gpu0.vram") == 6 * GIB
    assert ledger.holds("r1")
    ledger.release("r1")
    assert ledger.reserved("n", "host.ram") == ledger.reserved("n", "gpu0.vram") == 0
    assert not ledger.holds("r1")
    ledger.release("r1")  # releasing again, or an unknown holder, changes nothing


def test_charging_again_is_an_upsert_not_a_second_charge():
    ledger = ledger_with()
    for _ in range(3):
        ledger.charge("r1", "n", [Claim(RAM, GIB)])
    assert ledger.reserved("n", "host.ram") == GIB
    ledger.charge("r1", "n", [Claim(RAM, 3 * GIB)])
    assert ledger.reserved("n", "host.ram") == 3 * GIB


def test_margin_is_never_filled():
    ledger = ledger_with(domains=[Domain("host.ram", RAM, 10 * GIB, margin=GIB)])
    assert ledger.fits("n", [Claim(RAM, 9 * GIB)]).ok
    refused = ledger.fits("n", [Claim(RAM, 9 * GIB + 1)])
    assert refused.reason == "NO_CAPACITY"
    ledger.charge("r1", "n", [Claim(RAM, 9 * GIB)])
    assert not ledger.fits("n", [Claim(RAM, 1)]).ok
    (view,) = ledger.views()
    assert view.available == 0 and view.reserved == 9 * GIB


def test_a_charge_past_capacity_is_recorded_and_the_domain_is_then_full():
    ledger = ledger_with(domains=[Domain("host.ram", RAM, 4 * GIB)])
    ledger.charge("r1", "n", [Claim(RAM, 6 * GIB)])
    (view,) = ledger.views()
    assert view.reserved == view.requested == 6 * GIB and view.available == 0
    assert ledger.fits("n", [Claim(RAM, 1)]) == Fit(
        False, "NO_CAPACITY", "host.ram needs 1 B, 0.0 MiB available"
    )
    assert ledger.fits("n", [Claim(RAM, 0)]).ok  # nothing needed, nothing refused


def test_capacity_refusal_names_the_domain_and_both_amounts():
    ledger = ledger_with(domains=[Domain("host.ram", RAM, 100 * MIB)])
    assert ledger.fits("n", [Claim(RAM, 512 * MIB)]).message == (
        "host.ram needs 512.0 MiB, 100.0 MiB available"
    )


def test_unified_pool_is_charged_by_both_ram_and_vram_claims():
    ledger = ledger_with(domains=[Domain("unified", UNIFIED, 32 * GIB, margin=2 * GIB)])
    ledger.charge("r1", "n", [Claim(RAM, 4 * GIB), Claim(VRAM, 10 * GIB, device=3)])
    assert ledger.reserved("n", "unified") == 14 * GIB
    assert ledger.fits("n", [Claim(RAM, 8 * GIB), Claim(VRAM, 8 * GIB)]).ok
    # RAM and VRAM together exceed what is left of the one pool, though each alone would fit.
    assert not ledger.fits("n", [Claim(RAM, 9 * GIB), Claim(VRAM, 8 * GIB)]).ok


def test_a_unified_domain_takes_the_charges_even_beside_separate_domains():
    ledger = ledger_with(domains=[*host_and_gpu(), Domain("unified", UNIFIED, 16 * GIB)])
    ledger.charge("r1", "n", [Claim(RAM, GIB), Claim(VRAM, GIB)])
    assert ledger.reserved("n", "unified") == 2 * GIB
    assert ledger.reserved("n", "host.ram") == ledger.reserved("n", "gpu0.vram") == 0


def test_vram_claims_charge_the_domain_of_their_device():
    ledger = ledger_with(
        domains=[
            Domain("gpu0.vram", VRAM, 24 * GIB, device=0),
            Domain("gpu1.vram", VRAM, 24 * GIB, device=1),
        ]
    )
    ledger.charge("r1", "n", [Claim(VRAM, 20 * GIB, device=1)])
    assert ledger.reserved("n", "gpu1.vram") == 20 * GIB
    assert ledger.fits("n", [Claim(VRAM, 20 * GIB, device=0)]).ok
    assert not ledger.fits("n", [Claim(VRAM, 20 * GIB, device=1)]).ok


def test_a_claim_whose_domain_the_node_lacks_makes_it_ineligible():
    ledger = ledger_with(domains=host_and_gpu())
    assert ledger.fits("n", [Claim(VRAM, GIB, device=1)]) == Fit(
        False, "NO_ELIGIBLE_NODE", "node n has no VRAM domain for device 1"
    )
    cpu_only = ledger_with("cpu", [Domain("host.ram", RAM, GIB)])
    assert cpu_only.fits("cpu", [Claim(VRAM, 1)]).reason == "NO_ELIGIBLE_NODE"
    gpu_only = ledger_with("gpu", [Domain("gpu0.vram", VRAM, GIB)])
    assert gpu_only.fits("gpu", [Claim(RAM, 1)]) == Fit(
        False, "NO_ELIGIBLE_NODE", "node gpu has no RAM domain"
    )


def test_a_zero_byte_claim_charges_nothing_and_needs_no_domain():
    ledger = ledger_with("cpu", [Domain("host.ram", RAM, GIB)])
    assert ledger.fits("cpu", [Claim(VRAM, 0, device=5), Claim(RAM, GIB)]).ok
    ledger.charge("r1", "cpu", [Claim(VRAM, 0, device=5)])
    assert ledger.reserved("cpu", "host.ram") == 0


def test_an_unknown_node_is_not_eligible():
    assert Ledger().fits("ghost", [Claim(RAM, 1)]) == Fit(
        False, "NO_ELIGIBLE_NODE", "node ghost is not known"
    )


def test_uncertain_residency_blocks_only_the_domains_it_charges_until_charged_certain():
    ledger = ledger_with()
    ledger.charge("r1", "n", [Claim(VRAM, GIB)], uncertain=True)
    assert ledger.fits("n", [Claim(VRAM, 1)]) == Fit(
        False, "NO_CAPACITY", "gpu0.vram is blocked by uncertain residency r1"
    )
    assert ledger.fits("n", [Claim(RAM, GIB)]).ok  # host.ram is not touched by r1
    assert ledger.reserved("n", "gpu0.vram") == GIB  # it keeps its charge
    blocked = {view.domain.name: view.blocked_reason for view in ledger.views()}
    assert blocked == {
        "gpu0.vram": "gpu0.vram is blocked by uncertain residency r1",
        "host.ram": "",
    }
    ledger.charge("r1", "n", [Claim(VRAM, GIB)], uncertain=False)
    assert ledger.fits("n", [Claim(VRAM, 1)]).ok
    assert all(view.blocked_reason == "" for view in ledger.views())


@pytest.mark.parametrize("kind", [0, 3, 7])
def test_a_holder_with_an_unknown_claim_kind_blocks_its_whole_node(kind: int):
    ledger = ledger_with()
    ledger.set_node("other", host_and_gpu())
    ledger.charge("r1", "n", [Claim(RAM, GIB), Claim(kind, 0)])
    message = (
        f"node n holds residency r1 with an unknown claim kind {kind}: "
        "nothing more is admitted there until it is reconciled"
    )
    assert ledger.fits("n", [Claim(VRAM, 1)]) == Fit(False, "NO_CAPACITY", message)
    assert ledger.fits("n", []) == Fit(False, "NO_CAPACITY", message)
    assert ledger.fits("other", [Claim(VRAM, 1)]).ok
    assert ledger.reserved("n", "host.ram") == GIB  # its known claims still count
    assert {view.blocked_reason for view in ledger.views() if view.node_id == "n"} == {message}
    ledger.charge("r1", "n", [Claim(RAM, GIB)])  # reconciled
    assert ledger.fits("n", [Claim(VRAM, 1)]).ok


@pytest.mark.parametrize("kind", [0, 3, 7])
def test_a_request_with_an_unknown_claim_kind_is_refused_on_every_node(kind: int):
    ledger = ledger_with()
    assert ledger.fits("n", [Claim(RAM, 1), Claim(kind, 0)]) == Fit(
        False, "NO_ELIGIBLE_NODE", f"claim kind {kind} is unknown"
    )
    assert ledger.free_fractions(["n"], demand_of([Claim(kind, 5)])) == {}


def test_a_replacement_holds_the_componentwise_max_until_transfer():
    ledger = ledger_with()
    ledger.charge("old", "n", [Claim(RAM, 4 * GIB), Claim(VRAM, 10 * GIB)])
    ledger.charge("new", "n", [Claim(RAM, 6 * GIB), Claim(VRAM, 8 * GIB)], replaces="old")
    assert ledger.reserved("n", "host.ram") == 6 * GIB
    assert ledger.reserved("n", "gpu0.vram") == 10 * GIB
    assert {view.requested for view in ledger.views()} == {10 * GIB, 18 * GIB}
    ledger.release("old")  # transfer: the new one holds its own
    assert ledger.reserved("n", "host.ram") == 6 * GIB
    assert ledger.reserved("n", "gpu0.vram") == 8 * GIB


def test_a_rolled_back_replacement_leaves_the_old_holding_its_own():
    ledger = ledger_with()
    ledger.charge("old", "n", [Claim(RAM, 4 * GIB), Claim(VRAM, 10 * GIB)])
    ledger.charge("new", "n", [Claim(RAM, 6 * GIB)], replaces="old")
    assert ledger.reserved("n", "host.ram") == 6 * GIB
    ledger.release("new")
    assert ledger.reserved("n", "host.ram") == 4 * GIB
    assert ledger.reserved("n", "gpu0.vram") == 10 * GIB


def test_a_replacement_announced_before_the_holder_it_replaces_pairs_once_both_are_held():
    ledger = ledger_with()
    ledger.charge("new", "n", [Claim(RAM, 6 * GIB)], replaces="old")
    ledger.charge("old", "n", [Claim(RAM, 4 * GIB)])
    assert ledger.reserved("n", "host.ram") == 6 * GIB


def test_a_replacement_on_another_node_holds_in_full():
    ledger = ledger_with("a")
    ledger.set_node("b", host_and_gpu())
    ledger.charge("old", "a", [Claim(RAM, 4 * GIB)])
    ledger.charge("new", "b", [Claim(RAM, 6 * GIB)], replaces="old")
    assert ledger.reserved("a", "host.ram") == 4 * GIB
    assert ledger.reserved("b", "host.ram") == 6 * GIB


def test_two_replacements_of_one_holder_do_not_share_its_room():
    ledger = ledger_with()
    ledger.charge("old", "n", [Claim(RAM, 10 * GIB)])
    ledger.charge("new-a", "n", [Claim(RAM, 8 * GIB)], replaces="old")
    ledger.charge("new-b", "n", [Claim(RAM, 8 * GIB)], replaces="old")
    # new-a pairs (smallest id); new-b holds in full, so the two new ones are covered.
    assert ledger.reserved("n", "host.ram") == 18 * GIB
    assert ledger.reserved("n", "host.ram") == ledger.recomputed_reserved()[("n", "host.ram")]


def test_moving_a_replacement_to_another_node_ends_the_pair():
    ledger = ledger_with("a")
    ledger.set_node("b", host_and_gpu())
    ledger.charge("old", "a", [Claim(RAM, 4 * GIB)])
    ledger.charge("new", "a", [Claim(RAM, 6 * GIB)], replaces="old")
    ledger.charge("new", "b", [Claim(RAM, 6 * GIB)], replaces="old")
    assert ledger.reserved("a", "host.ram") == 4 * GIB
    assert ledger.reserved("b", "host.ram") == 6 * GIB


def test_a_chain_of_replacements_pairs_again_when_its_first_link_is_released():
    ledger = ledger_with()
    ledger.charge("first", "n", [Claim(RAM, 2 * GIB)])
    ledger.charge("second", "n", [Claim(RAM, 3 * GIB)], replaces="first")
    ledger.charge("third", "n", [Claim(RAM, 4 * GIB)], replaces="second")
    # second is both replacing and replaced: no pair forms, so each holds its own in full.
    assert ledger.reserved("n", "host.ram") == 9 * GIB
    ledger.release("first")
    # second replaces nothing held now, so third pairs with it.
    assert ledger.reserved("n", "host.ram") == 4 * GIB
    ledger.release("second")
    assert ledger.reserved("n", "host.ram") == 4 * GIB


def test_redeclaring_a_node_keeps_its_charges():
    ledger = ledger_with(domains=host_and_gpu(ram=8 * GIB))
    ledger.charge("r1", "n", [Claim(RAM, 6 * GIB)])
    ledger.set_node("n", host_and_gpu(ram=16 * GIB))
    assert ledger.reserved("n", "host.ram") == 6 * GIB
    assert ledger.fits("n", [Claim(RAM, 10 * GIB)]).ok


def test_a_charge_on_a_node_not_yet_declared_counts_once_it_is():
    ledger = Ledger()
    ledger.charge("r1", "late", [Claim(RAM, GIB)], uncertain=True)
    ledger.set_node("late", host_and_gpu())
    assert ledger.reserved("late", "host.ram") == GIB
    assert not ledger.fits("late", [Claim(RAM, 1)]).ok


def test_removing_a_node_releases_its_holders():
    ledger = ledger_with()
    ledger.charge("r1", "n", [Claim(RAM, GIB)])
    ledger.remove_node("n")
    assert not ledger.holds("r1")
    assert ledger.views() == []
    assert ledger.fits("n", [Claim(RAM, 1)]).reason == "NO_ELIGIBLE_NODE"


def test_free_fraction_is_the_scarcest_dimension_after_the_claims():
    ledger = ledger_with(domains=host_and_gpu(ram=100 * GIB, vram=100 * GIB))
    ledger.charge("r1", "n", [Claim(VRAM, 70 * GIB)])
    assert ledger.free_fraction("n", [Claim(RAM, GIB), Claim(VRAM, 10 * GIB)]) == pytest.approx(0.2)
    assert ledger.free_fraction("n", [Claim(RAM, 50 * GIB)]) == pytest.approx(0.5)
    assert ledger.free_fraction("n", []) == pytest.approx(0.3)  # no claims: every domain
    assert ledger.free_fraction("ghost", []) == 0.0


def test_views_are_sorted_by_node_then_domain():
    ledger = ledger_with("b")
    ledger.set_node("a", host_and_gpu())
    assert [(view.node_id, view.domain.name) for view in ledger.views()] == [
        ("a", "gpu0.vram"),
        ("a", "host.ram"),
        ("b", "gpu0.vram"),
        ("b", "host.ram"),
    ]


# -- lockstep under random histories ----------------------------------------------------------

# Few holders and nodes, so replacement chains, moves and collisions come up often.
HOLDERS = [f"h{index}" for index in range(4)]
NODES = ["n0", "n1", "n2"]
LAYOUTS = [
    host_and_gpu(ram=16 * GIB, vram=24 * GIB, margin=GIB),
    [Domain("unified", UNIFIED, 32 * GIB, margin=2 * GIB)],
    [
        Domain("host.ram", RAM, 8 * GIB),
        Domain("gpu0.vram", VRAM, 12 * GIB, device=0),
        Domain("gpu1.vram", VRAM, 12 * GIB, device=1),
    ],
    [Domain("host.ram", RAM, 8 * GIB)],
]

claims_strategy = st.lists(
    st.builds(
        Claim,
        kind=st.sampled_from([RAM, RAM, VRAM, VRAM, 0, 7]),
        bytes=st.integers(0, 20).map(lambda gib: gib * GIB),
        device=st.integers(0, 1),
    ),
    max_size=3,
)
operation = st.one_of(
    st.tuples(
        st.just("charge"),
        st.sampled_from(HOLDERS),
        st.sampled_from(NODES),
        claims_strategy,
        st.sampled_from(HOLDERS) | st.just(""),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.sampled_from(HOLDERS)),
    st.tuples(st.just("set_node"), st.sampled_from(NODES), st.integers(0, len(LAYOUTS) - 1)),
    st.tuples(st.just("remove_node"), st.sampled_from(NODES)),
    st.tuples(st.just("ask"), claims_strategy),
)


def _apply(ledger: Ledger, step: tuple) -> None:  # type: ignore[type-arg]
    kind, *args = step
    if kind == "charge":
        holder, node, claims, replaces, uncertain = args
        ledger.charge(holder, node, claims, replaces=replaces, uncertain=uncertain)
    elif kind == "release":
        ledger.release(args[0])
    elif kind == "set_node":
        ledger.set_node(args[0], LAYOUTS[args[1]])
    elif kind == "remove_node":
        ledger.remove_node(args[0])
    else:
        # Asking fills the nodes' memos, so the next changes must clear them correctly.
        demand = demand_of(args[0])
        fitting = ledger.free_fractions(NODES, demand)
        for node in NODES:
            outcome = ledger.measure(node, demand)
            assert fitting.get(node) == (outcome if isinstance(outcome, float) else None)


def _assert_in_lockstep(ledger: Ledger) -> None:
    views = ledger.views()
    assert {(v.node_id, v.domain.name): v.reserved for v in views} == ledger.recomputed_reserved()
    for view in views:
        # A pair only hides the smaller of two claims, never a third holder's.
        assert 0 <= view.reserved <= view.requested
        usable = max(0, view.domain.capacity - view.domain.margin)
        assert view.available == max(0, usable - view.reserved)


@settings(max_examples=200, deadline=None)
@given(
    layouts=st.lists(st.integers(0, len(LAYOUTS) - 1), min_size=3, max_size=3),
    steps=st.lists(operation, max_size=40),
)
def test_reserve_and_release_stay_in_lockstep(layouts: list[int], steps: list[tuple]) -> None:  # type: ignore[type-arg]
    ledger = Ledger()
    for node, layout in zip(NODES, layouts, strict=True):
        ledger.set_node(node, LAYOUTS[layout])
    for step in steps:
        _apply(ledger, step)
        _assert_in_lockstep(ledger)
    for holder in HOLDERS:
        ledger.release(holder)
        _assert_in_lockstep(ledger)
    for view in ledger.views():
        assert view.reserved == view.requested == 0
        assert view.blocked_reason == ""


def test_a_node_at_its_holder_bound_refuses_even_a_claim_of_nothing_until_one_is_released():
    ledger = Ledger()
    ledger.set_node("n", host_and_gpu(), max_holders=2)
    ledger.charge("r1", "n", [Claim(RAM, GIB)])
    ledger.charge("r1", "n", [Claim(RAM, 2 * GIB)])  # an upsert holds one slot, not two
    assert ledger.fits("n", [Claim(RAM, GIB)]) == Fit(True)
    ledger.charge("r2", "n", [])
    refused = Fit(
        False, "NO_CAPACITY", "its worker holds at most 2 model hosts and 2 are resident or placed"
    )
    assert ledger.fits("n", []) == refused
    assert ledger.free_fractions(["n"], demand_of([Claim(RAM, GIB)])) == {}
    # Re-declaring the node keeps its holders and so its count.
    ledger.set_node("n", host_and_gpu(ram=128 * GIB), max_holders=2)
    assert ledger.fits("n", [Claim(RAM, GIB)]) == refused
    ledger.release("r1")
    assert ledger.fits("n", [Claim(RAM, GIB)]) == Fit(True)
    assert "n" in ledger.free_fractions(["n"], demand_of([Claim(RAM, GIB)]))
    ledger.remove_node("n")
    ledger.set_node("n", host_and_gpu(), max_holders=1)
    assert ledger.fits("n", []) == Fit(True)  # removing the node released r2 as well


def test_a_node_without_a_holder_bound_takes_any_number():
    ledger = ledger_with()
    for index in range(50):
        ledger.charge(f"r{index}", "n", [])
    assert ledger.fits("n", [Claim(RAM, GIB)]) == Fit(True)
