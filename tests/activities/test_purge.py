"""A purge batch's page on the dev server (a page lists item workflows through visibility):
pages go in key order after a cursor, and bulk-mode items, which only the read model lists, are
purged with the rest."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal import CancelRequested
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus, NewItem
from durable_outbox_temporal.contract.purge import PurgePageRequest

from activities.purge import PurgeActivities
from readmodel import store
from service.items import ItemService
from tests.conftest import email_destination, unique_name, webhook_destination
from tests.fakes import deliveries
from tests.workflows.test_bulk import until_settled
from tests.workflows.test_lane import wait_for
from tests.workflows.test_outbox_item import EMAIL


async def test_purge_pages_go_in_key_order_after_the_cursor(
    stack_factory: Any, fake_provider: Any, dev_env: Any
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    items = ItemService(stack.outbox, stack.engine)
    outbox = f"pages-{uuid.uuid4().hex[:8]}"
    later = datetime.now(UTC) + timedelta(hours=1)
    keys = [f"k{n}" for n in range(5)]
    for key in reversed(keys):
        await items.enqueue(outbox, NewItem(destination.name, {"key": key}, key, not_before=later))

    async def all_listed() -> bool:
        # Visibility trails the starts by a moment.
        return len(await stack.outbox.queued_keys(outbox)) == len(keys)

    await wait_for(all_listed)

    purge = PurgeActivities(stack.outbox, stack.engine)
    pages = []
    cursor = None
    while True:
        page = await purge.purge_page(PurgePageRequest(outbox, None, "paged", cursor, limit=2))
        pages.append(page.cancelled)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor

    assert pages == [["k0", "k1"], ["k2", "k3"], ["k4"]]
    for key in keys:
        view = await stack.outbox.status(outbox, key)
        assert view.status == "cancelled"
        assert item_workflow_id(outbox, key) == view.id


async def test_a_queued_bulk_item_is_cancelled_and_a_purge_cancels_the_rest(
    dev_env, stack_factory, fake_provider
) -> None:
    # The dev server: a purge lists item workflows in visibility (and finds none here).
    destination = email_destination(fake_provider, mode="bulk", shards=2)
    stack = await stack_factory(destination, env=dev_env)
    service = ItemService(stack.outbox, stack.engine)
    later = datetime.now(UTC) + timedelta(hours=1)
    keys = [unique_name("later") for _ in range(4)]
    for key in keys:
        await service.enqueue("tests", NewItem(destination.name, EMAIL, key, not_before=later))

    outcome = await service.cancel("tests", keys[0], "changed my mind")
    assert isinstance(outcome, CancelRequested)
    purge = PurgeActivities(stack.outbox, stack.engine)
    purged = await purge.purge_page(PurgePageRequest("tests", destination.name, "purged", None))
    # The one cancelled already may still read `queued` in the read model: cancelled again.
    assert set(keys[1:]) <= set(purged.cancelled) <= set(keys)
    assert purged.next_cursor is None  # one page holds them all
    ids = [item_workflow_id("tests", key) for key in keys]
    await until_settled(stack, ids, timeout_s=30)

    for item_id in ids:
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.CANCELLED
        assert await deliveries(fake_provider, item_id) == 0
    events = store.item_events(stack.engine, ids[0])
    assert [(e.type, e.detail) for e in events][-1] == ("cancelled", "changed my mind")
