"""The fairness key an outbox's submits and polls carry fits the server's 64-byte limit."""

from __future__ import annotations

from durable_outbox_temporal.contract.ids import MAX_FAIRNESS_KEY_BYTES, outbox_fairness_key
from durable_outbox_temporal.contract.limits import MAX_OUTBOX_LENGTH, check_outbox_name


def test_a_name_that_fits_is_its_own_key() -> None:
    name = "b" * MAX_FAIRNESS_KEY_BYTES
    assert outbox_fairness_key("billing") == "billing"
    assert outbox_fairness_key(name) == name


def test_longer_names_get_distinct_stable_keys_that_fit() -> None:
    shared_prefix = "tenant-" + "x" * 60
    first, second = shared_prefix + "-a", shared_prefix + "-b"
    check_outbox_name(first)

    keys = {outbox_fairness_key(first), outbox_fairness_key(second)}

    assert len(keys) == 2
    assert outbox_fairness_key(first) == outbox_fairness_key(first)
    assert all(len(key.encode()) == MAX_FAIRNESS_KEY_BYTES for key in keys)
    longest = outbox_fairness_key("z" * MAX_OUTBOX_LENGTH)
    assert len(longest.encode()) <= MAX_FAIRNESS_KEY_BYTES
    # No outbox name contains "~", so a shortened key never equals a name that fits.
    assert "~" in longest
