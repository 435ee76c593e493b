"""Which generation a Hello claims (nodes/store.py `generation_to_claim`): issued by the control
plane, kept only for the same process reconnecting, never the value a worker names."""

from __future__ import annotations

from gantry.common.ids import GENERATION_STEP
from gantry.controlplane.nodes.store import generation_to_claim


def test_a_new_process_gets_the_next_generation():
    claimed = generation_to_claim(stored=0, presented=0)
    assert 0 < claimed <= GENERATION_STEP
    assert 500 < generation_to_claim(stored=500, presented=0) <= 500 + GENERATION_STEP


def test_the_holder_reconnecting_keeps_its_generation():
    assert generation_to_claim(stored=500, presented=500) == 500


def test_a_generation_from_the_future_is_not_taken_the_next_one_is_issued():
    claimed = generation_to_claim(stored=500, presented=2**63 - 1)
    assert 500 < claimed <= 500 + GENERATION_STEP


def test_an_older_generation_gets_a_newer_one_and_so_takes_the_node_back():
    impostor = generation_to_claim(stored=500, presented=0)
    real = generation_to_claim(stored=impostor, presented=500)
    assert real > impostor > 500
