"""Test-side helpers to script the fake provider and read its counters by item id."""

from __future__ import annotations

from typing import Any

from durable_outbox_temporal.contract.ids import provider_idempotency_key

from devstack.fake_provider import FakeProvider


async def script(fake: FakeProvider, item_id: str, steps: list[dict[str, Any]]) -> None:
    """Answer the item's next submits with `steps` (set it before enqueueing the item)."""
    await fake.admin.script(provider_idempotency_key(item_id), steps)


async def key_stats(fake: FakeProvider, item_id: str, generation: int = 0) -> dict[str, Any]:
    return await fake.admin.key_stats(provider_idempotency_key(item_id, generation))


async def submits(fake: FakeProvider, item_id: str, generation: int = 0) -> int:
    """Submit requests the provider received for one generation of the item (0: before any
    redrive), faulted ones included."""
    return int((await key_stats(fake, item_id, generation))["submits"])


async def deliveries(fake: FakeProvider, item_id: str, generation: int = 0) -> int:
    """Times the provider accepted one generation of the item as new: exactly 1 once sent."""
    return int((await key_stats(fake, item_id, generation))["deliveries"])


async def max_requests_in_window(fake: FakeProvider, path_prefix: str, window_s: float) -> int:
    return await fake.admin.max_rate(path_prefix, window_s)
