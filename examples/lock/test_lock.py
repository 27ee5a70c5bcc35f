"""The lock definition as plain functions: a lease, its timer and its expiry, no Temporal."""

from __future__ import annotations

from datetime import timedelta

import pytest

from examples.lock.domainmodel import LeaseExpired, Lock, LockHeld, LockState, NotHolder
from examples.testing import NOW, decide, run

LOCK = Lock()


def test_lock_is_held_until_released_or_expired() -> None:
    state = run(LOCK, [("acquire", {"holder": "h1", "ttl_s": 30})])

    assert state == LockState(holder="h1", until=NOW + timedelta(seconds=30))
    with pytest.raises(LockHeld):
        decide(LOCK, state, "acquire", {"holder": "h2", "ttl_s": 30})
    with pytest.raises(NotHolder):
        decide(LOCK, state, "release", {"holder": "h2"})
    [timer] = LOCK.timers(state)
    assert timer.at == NOW + timedelta(seconds=30) and timer.command == "expire"
    assert decide(LOCK, state, "expire", dict(timer.payload)) == [LeaseExpired(holder="h1")]


def test_an_expiry_for_a_renewed_lease_changes_nothing() -> None:
    state = run(LOCK, [("acquire", {"holder": "h1", "ttl_s": 30})])
    [old_timer] = LOCK.timers(state)
    later = LOCK.evolve(state, decide(LOCK, state, "renew", {"holder": "h1", "ttl_s": 60})[0])

    assert decide(LOCK, later, "expire", dict(old_timer.payload)) == []
