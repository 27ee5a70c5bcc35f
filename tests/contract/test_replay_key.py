"""A replayed item's key: from the replay and the original, within the key limit."""

from __future__ import annotations

from durable_outbox_temporal.contract.limits import MAX_KEY_LENGTH
from durable_outbox_temporal.contract.replay import replay_key
from durable_outbox_temporal.validation import validate_key

REPLAY_ID = "0123456789abcdef0123456789abcdef"


def test_the_key_names_the_replay_and_the_original() -> None:
    assert replay_key(REPLAY_ID, "inv-7") == f"replay:{REPLAY_ID}:inv-7"


def test_a_key_too_long_to_prefix_is_hashed_and_stays_distinct_and_valid() -> None:
    long_a, long_b = "a" * MAX_KEY_LENGTH, "a" * (MAX_KEY_LENGTH - 1) + "b"
    key_a, key_b = replay_key(REPLAY_ID, long_a), replay_key(REPLAY_ID, long_b)

    assert key_a.startswith(f"replay:{REPLAY_ID}:sha256:") and key_a != key_b
    assert key_a == replay_key(REPLAY_ID, long_a)  # the same replay finds the same key
    assert validate_key(key_a) == key_a and len(key_a) <= MAX_KEY_LENGTH
    assert replay_key("f" * 32, long_a) != key_a
