"""Test-side helpers to script the fake provider and read its counters by item id."""

from __future__ import annotations

from typing import Any

from contract.ids import provider_idempotency_key
from devstack.fake_provider import FakeProvider


async def script(fake: FakeProvider, item_id: str, steps: list[dict[str, Any]]) -> None:
    """Answer the item's next submits with `steps` (set it before enqueueing the item)."""
    await fake.admin.script(provider_idempotency_key(item_id), steps)


async def key_stats(fake: FakeProvider, item_id: str) -> dict[str, Any]:
    return await fake.admin.key_stats(provider_idempotency_key(item_id))


async def submits(fake: FakeProvider, item_id: str) -> int:
    """Submit requests the provider received for the item, faulted ones included."""
    return int((await key_stats(fake, item_id))["submits"])


async def deliveries(fake: FakeProvider, item_id: str) -> int:
    """Times the provider accepted the item as new: exactly 1 for a delivered item."""
    return int((await key_stats(fake, item_id))["deliveries"])


async def max_requests_in_window(fake: FakeProvider, path_prefix: str, window_s: float) -> int:
    return await fake.admin.max_rate(path_prefix, window_s)
