"""The leadership's pure parts and its transitions given what the lock says, without IO: the
lock is scripted (what `hold` answers each look), the rules are platform/leadership.py's."""

from __future__ import annotations

import logging

import pytest

from gantry.controlplane.platform.leadership import (
    Leadership,
    Standing,
    fence_refusal,
    observe,
    ping_interval,
)


class ScriptedLock:
    """Answers each `hold` with the next scripted epoch (None: not held)."""

    def __init__(self, *answers: int | None) -> None:
        self.answers = list(answers)
        self.released = False

    async def hold(self) -> int | None:
        return self.answers.pop(0)

    async def release(self) -> None:
        self.released = True


def test_taking_the_lock_leads_at_its_epoch_and_keeping_it_changes_nothing():
    standing, line = observe(Standing(), 4)
    assert standing == Standing(leading=True, epoch=4)
    assert line == "leading (epoch 4)"
    assert observe(standing, 4) == (standing, None)


def test_losing_the_lock_stops_leading_and_says_which_epoch_was_lost():
    standing, line = observe(Standing(leading=True, epoch=4), None)
    assert standing == Standing(leading=False, epoch=4)
    assert line is not None and line.startswith("lost leadership (epoch 4)")
    # A follower that still does not hold it says nothing more.
    assert observe(standing, None) == (standing, None)


def test_a_new_epoch_while_leading_is_taken_as_the_new_lead():
    # The lock was lost and taken again between two looks: decisions carry the new epoch.
    standing, line = observe(Standing(leading=True, epoch=4), 6)
    assert standing == Standing(leading=True, epoch=6)
    assert line == "leading (epoch 6)"


@pytest.mark.parametrize(
    ("standing", "stored", "refused"),
    [
        (Standing(leading=True, epoch=3), 3, False),
        (Standing(leading=True, epoch=3), 4, True),  # a newer leader bumped it: a paused ex-leader
        (Standing(leading=False, epoch=3), 3, True),  # lost the lock, no one took it yet
        (Standing(), None, True),  # never led; no row
    ],
)
def test_the_fence_lets_only_the_current_epoch_write(
    standing: Standing, stored: int | None, refused: bool
):
    refusal = fence_refusal(standing, stored)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert refusal.reason == "NOT_LEADER"
        assert refusal.metadata["current_epoch"] == str(stored)


def test_pings_and_tries_come_three_times_a_lease():
    assert ping_interval(6.0) == 2.0


async def test_a_leadership_follows_what_its_lock_says_and_logs_the_loss(
    caplog: pytest.LogCaptureFixture,
):
    lock = ScriptedLock(None, 1, 1, None, None, 2)
    leadership = Leadership(lock, lease_s=3.0)
    assert not leadership.is_leader  # nothing decided before the first look
    seen: list[tuple[bool, int]] = []
    with caplog.at_level(logging.INFO, logger="gantry.controlplane.platform.leadership"):
        for _ in range(6):
            await leadership.step()
            seen.append((leadership.is_leader, leadership.epoch))
    assert seen == [(False, 0), (True, 1), (True, 1), (False, 1), (False, 1), (True, 2)]
    lost = [r for r in caplog.records if "lost leadership" in r.getMessage()]
    assert [(r.levelno, r.getMessage()[:26]) for r in lost] == [
        (logging.WARNING, "lost leadership (epoch 1):")
    ]
    await leadership.stop()
    assert lock.released and not leadership.is_leader


async def test_a_single_replica_always_leads_at_epoch_one():
    leadership = Leadership.single()
    await leadership.start()
    await leadership.step()
    assert (leadership.is_leader, leadership.epoch) == (True, 1)
    await leadership.stop()
    assert leadership.is_leader  # SQLite: nothing to give back, no one else to lead
