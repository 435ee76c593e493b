"""The scheduler's placement policy: gates, BIN_PACK and SPREAD, determinism."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.scheduler.policy.ledger import Ledger
from gantry.scheduler.policy.placement import (
    NodeCandidate,
    NodeRefusal,
    NotPlaced,
    Placed,
    bench_placement,
    place,
)
from gantry.scheduler.policy.types import Claim, Domain, PlacementPolicy, ResourceKind

MIB = 1 << 20
GIB = 1 << 30
RAM = ResourceKind.RAM
VRAM = ResourceKind.VRAM
BIN_PACK = PlacementPolicy.BIN_PACK
SPREAD = PlacementPolicy.SPREAD


def host_and_gpu(ram: int = 100 * GIB, vram: int = 100 * GIB) -> list[Domain]:
    return [Domain("host.ram", RAM, ram), Domain("gpu0.vram", VRAM, vram, device=0)]


def node(node_id: str, *, connected: bool = True, labels: tuple[str, ...] = ()) -> NodeCandidate:
    return NodeCandidate(node_id=node_id, connected=connected, labels=frozenset(labels))


def placing(
    nodes: list[NodeCandidate],
    ledger: Ledger,
    claims: list[Claim],
    *,
    policy: PlacementPolicy = BIN_PACK,
    replicas: int = 1,
    required_labels: frozenset[str] = frozenset(),
    exclude: tuple[str, ...] = (),
) -> Placed | NotPlaced:
    return place(
        nodes=nodes,
        ledger=ledger,
        claims=claims,
        required_labels=required_labels,
        replicas=replicas,
        exclude=exclude,
        policy=policy,
    )


def ledger_of(*node_ids: str, ram: int = 100 * GIB, vram: int = 100 * GIB) -> Ledger:
    ledger = Ledger()
    for node_id in node_ids:
        ledger.set_node(node_id, host_and_gpu(ram, vram))
    return ledger


def refusals(result: Placed | NotPlaced) -> dict[str, tuple[str, str]]:
    assert isinstance(result, NotPlaced), result
    return {r.node_id: (r.reason, r.message) for r in result.node_refusals}


def test_a_disconnected_node_is_refused_as_not_connected():
    result = placing([node("a", connected=False, labels=())], ledger_of("a"), [Claim(RAM, GIB)])
    assert refusals(result) == {"a": ("NO_ELIGIBLE_NODE", "not connected")}


def test_a_node_that_already_holds_a_replica_is_refused():
    result = placing([node("a")], ledger_of("a"), [Claim(RAM, GIB)], exclude=("a",))
    assert refusals(result) == {"a": ("NO_ELIGIBLE_NODE", "already holds a replica")}


def test_the_capability_gate_lists_the_missing_labels():
    result = placing(
        [node("a", labels=("gpu",))],
        ledger_of("a"),
        [Claim(RAM, GIB)],
        required_labels=frozenset({"gpu", "modality:text", "adapter:st"}),
    )
    assert refusals(result) == {
        "a": ("NO_ELIGIBLE_NODE", "missing labels: adapter:st, modality:text")
    }


def test_a_node_whose_labels_cover_the_requirement_passes_the_capability_gate():
    result = placing(
        [node("a", labels=("gpu", "adapter:st", "extra"))],
        ledger_of("a"),
        [Claim(RAM, GIB)],
        required_labels=frozenset({"gpu", "adapter:st"}),
    )
    assert result == Placed(["a"])


def test_gates_apply_in_order_and_the_first_failure_is_reported():
    result = placing(
        [node("a", connected=False)],
        ledger_of(),  # unknown to the ledger too
        [Claim(RAM, GIB)],
        required_labels=frozenset({"gpu"}),
        exclude=("a",),
    )
    assert refusals(result) == {"a": ("NO_ELIGIBLE_NODE", "not connected")}


def test_a_node_without_room_is_refused_on_capacity_and_the_summary_says_why():
    ledger = ledger_of("node-a", "node-b", "node-c", ram=100 * MIB)
    result = placing(
        [node("node-c"), node("node-b", connected=False), node("node-a")],
        ledger,
        [Claim(RAM, 512 * MIB)],
    )
    assert isinstance(result, NotPlaced)
    assert result.reason == "NO_CAPACITY"
    assert [r.node_id for r in result.node_refusals] == ["node-a", "node-b", "node-c"]
    assert result.message == (
        "0 of 3 nodes can take it: "
        "node-a NO_CAPACITY (host.ram needs 512.0 MiB, 100.0 MiB available), "
        "node-b NO_ELIGIBLE_NODE (not connected), "
        "node-c NO_CAPACITY (host.ram needs 512.0 MiB, 100.0 MiB available)"
    )


def test_when_no_node_failed_on_capacity_the_reason_is_no_eligible_node():
    result = placing(
        [node("a", connected=False), node("b")], ledger_of("a", "b"), [Claim(VRAM, GIB, device=1)]
    )
    assert isinstance(result, NotPlaced) and result.reason == "NO_ELIGIBLE_NODE"
    assert refusals(result)["b"] == (
        "NO_ELIGIBLE_NODE",
        "node b has no VRAM domain for device 1",
    )


def test_a_long_refusal_summary_names_the_first_nodes_and_counts_the_rest():
    ids = [f"n{index:02d}" for index in range(12)]
    result = placing([node(i, connected=False) for i in ids], ledger_of(*ids), [])
    assert isinstance(result, NotPlaced)
    assert result.message.startswith("0 of 12 nodes can take it: n00 NO_ELIGIBLE_NODE")
    assert result.message.endswith(", and 7 more")
    assert len(result.node_refusals) == 12


def test_no_nodes_at_all_is_not_placed():
    result = placing([], Ledger(), [Claim(RAM, GIB)])
    assert isinstance(result, NotPlaced) and result.reason == "NO_ELIGIBLE_NODE"
    assert result.node_refusals == []


def test_bin_pack_takes_the_fullest_node_by_its_scarcest_dimension():
    ledger = ledger_of("plenty-of-ram", "balanced")
    # plenty-of-ram has all its RAM free but little VRAM: for a VRAM-heavy claim it is the fuller.
    ledger.charge("r1", "plenty-of-ram", [Claim(VRAM, 70 * GIB)])
    ledger.charge("r2", "balanced", [Claim(RAM, 50 * GIB), Claim(VRAM, 40 * GIB)])
    nodes = [node("balanced"), node("plenty-of-ram")]
    claims = [Claim(RAM, GIB), Claim(VRAM, 20 * GIB)]
    assert placing(nodes, ledger, claims, policy=BIN_PACK) == Placed(["plenty-of-ram"])
    assert placing(nodes, ledger, claims, policy=SPREAD) == Placed(["balanced"])


def test_bin_pack_skips_the_fullest_node_when_the_claim_does_not_fit_there():
    ledger = ledger_of("full", "half")
    ledger.charge("r1", "full", [Claim(VRAM, 95 * GIB)])
    ledger.charge("r2", "half", [Claim(VRAM, 50 * GIB)])
    result = placing([node("full"), node("half")], ledger, [Claim(VRAM, 10 * GIB)])
    assert result == Placed(["half"])


def test_spread_takes_the_least_loaded_node():
    ledger = ledger_of("a", "b", "c")
    ledger.charge("r1", "a", [Claim(RAM, 30 * GIB)])
    ledger.charge("r2", "c", [Claim(RAM, 10 * GIB)])
    nodes = [node("a"), node("b"), node("c")]
    assert placing(nodes, ledger, [Claim(RAM, GIB)], policy=SPREAD) == Placed(["b"])


@pytest.mark.parametrize("policy", [BIN_PACK, SPREAD])
def test_ties_break_by_node_id(policy: PlacementPolicy):
    ledger = ledger_of("b", "a", "c")
    result = placing([node("c"), node("b"), node("a")], ledger, [Claim(RAM, GIB)], policy=policy)
    assert result == Placed(["a"])


def test_replicas_go_on_distinct_nodes_best_first_and_fewer_when_fewer_fit():
    ledger = ledger_of("a", "b", "c", "d")
    ledger.charge("r1", "b", [Claim(RAM, 60 * GIB)])
    ledger.charge("r2", "c", [Claim(RAM, 30 * GIB)])
    ledger.charge("r3", "d", [Claim(RAM, 99 * GIB)])  # too full for the claim
    nodes = [node("a"), node("b"), node("c"), node("d")]
    claims = [Claim(RAM, 10 * GIB)]
    assert placing(nodes, ledger, claims, replicas=2) == Placed(["b", "c"])
    assert placing(nodes, ledger, claims, replicas=5) == Placed(["b", "c", "a"])
    assert placing(nodes, ledger, claims, replicas=2, policy=SPREAD) == Placed(["a", "c"])


def test_a_node_listed_twice_is_placed_once():
    result = placing([node("a"), node("a")], ledger_of("a"), [Claim(RAM, GIB)], replicas=2)
    assert result == Placed(["a"])


def test_an_uncertain_domain_still_lets_claims_that_do_not_touch_it_in():
    ledger = ledger_of("a")
    ledger.charge("r1", "a", [Claim(VRAM, GIB)], uncertain=True)
    assert placing([node("a")], ledger, [Claim(RAM, GIB)]) == Placed(["a"])
    assert refusals(placing([node("a")], ledger, [Claim(VRAM, GIB)])) == {
        "a": ("NO_CAPACITY", "gpu0.vram is blocked by uncertain residency r1")
    }


def test_a_holder_with_an_unknown_claim_kind_blocks_placement_on_its_node():
    ledger = ledger_of("a", "b")
    ledger.charge("r1", "a", [Claim(7, GIB)])
    assert placing([node("a"), node("b")], ledger, [Claim(RAM, GIB)]) == Placed(["b"])


def test_a_request_with_an_unknown_claim_kind_is_refused_on_every_node():
    result = placing([node("a"), node("b")], ledger_of("a", "b"), [Claim(7, GIB)])
    assert refusals(result) == {
        "a": ("NO_ELIGIBLE_NODE", "claim kind 7 is unknown"),
        "b": ("NO_ELIGIBLE_NODE", "claim kind 7 is unknown"),
    }


def test_placing_charges_nothing():
    ledger = ledger_of("a")
    assert placing([node("a")], ledger, [Claim(RAM, GIB)]) == Placed(["a"])
    assert ledger.reserved("a", "host.ram") == 0


def test_replicas_below_one_are_a_programming_error():
    with pytest.raises(ValueError):
        placing([node("a")], ledger_of("a"), [], replicas=0)


def test_the_benchmark_runs():
    assert bench_placement(nodes=20, placements=20) > 0


# -- properties -------------------------------------------------------------------------------

NODE_IDS = [f"node-{index}" for index in range(6)]
LABELS = ["gpu", "adapter:st", "modality:text"]

claims_strategy = st.lists(
    st.builds(
        Claim,
        kind=st.sampled_from([RAM, VRAM, VRAM]),
        bytes=st.integers(0, 8).map(lambda gib: gib * GIB),
        device=st.integers(0, 1),
    ),
    max_size=3,
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeCandidate], Ledger]:
    ledger = Ledger()
    nodes = []
    for node_id in NODE_IDS:
        domains = host_and_gpu(ram=16 * GIB, vram=draw(st.sampled_from([8, 16])) * GIB)
        if draw(st.booleans()):
            domains.append(Domain("gpu1.vram", VRAM, 16 * GIB, margin=GIB, device=1))
        ledger.set_node(node_id, domains)
        for index, claims in enumerate(draw(st.lists(claims_strategy, max_size=2))):
            ledger.charge(
                f"{node_id}-r{index}",
                node_id,
                claims,
                uncertain=draw(st.sampled_from([False, False, False, True])),
            )
        labels = draw(st.sets(st.sampled_from(LABELS)))
        connected = draw(st.sampled_from([True, True, False]))
        nodes.append(NodeCandidate(node_id, connected, frozenset(labels)))
    return nodes, ledger


placement_requests = st.fixed_dictionaries(
    {
        "claims": claims_strategy,
        "required_labels": st.frozensets(st.sampled_from(LABELS), max_size=2),
        "replicas": st.integers(1, 3),
        "exclude": st.sets(st.sampled_from(NODE_IDS), max_size=2).map(tuple),
        "policy": st.sampled_from([BIN_PACK, SPREAD]),
    }
)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), request=placement_requests, data=st.data())
def test_placement_is_the_same_whatever_the_order_of_the_nodes(cluster, request, data):  # type: ignore[no-untyped-def]
    nodes, ledger = cluster
    shuffled = data.draw(st.permutations(nodes))
    assert placing(shuffled, ledger, **request) == placing(nodes, ledger, **request)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), request=placement_requests)
def test_a_placed_claim_always_fits_and_the_choice_is_the_best_by_policy(cluster, request):  # type: ignore[no-untyped-def]
    nodes, ledger = cluster
    result = placing(nodes, ledger, **request)
    claims = request["claims"]
    passing = [
        candidate.node_id
        for candidate in nodes
        if candidate.connected
        and candidate.node_id not in request["exclude"]
        and request["required_labels"] <= candidate.labels
        and ledger.fits(candidate.node_id, claims).ok
    ]
    if isinstance(result, NotPlaced):
        assert passing == []
        assert all(isinstance(r, NodeRefusal) for r in result.node_refusals)
        assert len(result.node_refusals) == len(nodes)
        return
    assert len(result.node_ids) == min(request["replicas"], len(passing))
    assert len(set(result.node_ids)) == len(result.node_ids)
    assert set(result.node_ids) <= set(passing)
    sign = -1 if request["policy"] == SPREAD else 1
    ranked = sorted(passing, key=lambda n: (sign * ledger.free_fraction(n, claims), n))
    assert result.node_ids == ranked[: len(result.node_ids)]
