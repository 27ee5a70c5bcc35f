"""Debounce: items of one key within a window become one delivery, in item and bulk mode, at
the fake provider; the others end superseded by the item that carried them."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest
from durable_outbox_temporal import IdempotencyConflict, InvalidRequest
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.debounce import DebounceWindowView, debounce_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemView

from readmodel import store
from readmodel.writer import ProjectionWriter
from tests.conftest import Stack, unique_name, webhook_destination, workflow_result
from tests.workflows.test_bulk import until_settled

MODES = ["item", "bulk"]


async def _stack(stack_factory: Any, fake_provider: Any, mode: str) -> tuple[Stack, Any]:
    extra: dict[str, Any] = {"mode": "bulk", "shards": 1} if mode == "bulk" else {}
    destination = webhook_destination(fake_provider, **extra)
    return await stack_factory(destination), destination


async def _enqueue(stack: Stack, destination: Any, debounce_key: str, n: int, **kwargs: Any) -> str:
    key = kwargs.pop("key", None) or unique_name(f"member-{n}")
    kwargs.setdefault("debounce_s", 30)
    await stack.outbox.enqueue(
        "tests", destination.name, {"n": n}, key=key, debounce_key=debounce_key, **kwargs
    )
    return key


async def _windows_closed(stack: Stack, destination: Any, debounce_key: str) -> int:
    """Let time run until the key's window workflow ends; the windows its last run closed."""
    handle = stack.client.get_workflow_handle(
        debounce_workflow_id("tests", destination.name, debounce_key)
    )
    unlocked = (
        stack.env.time_skipping_unlocked()
        if stack.env.supports_time_skipping
        else contextlib.nullcontext()
    )
    async with unlocked:
        closed: int = await workflow_result(handle)
    await stack.record_history(handle.id, "_window")
    return closed


async def _window(stack: Stack, destination: Any, debounce_key: str) -> DebounceWindowView:
    handle = stack.client.get_workflow_handle(
        debounce_workflow_id("tests", destination.name, debounce_key)
    )
    view: DebounceWindowView = await handle.query("window", result_type=DebounceWindowView)
    return view


def _row(stack: Stack, key: str) -> OutboxItemView:
    record = store.get_item(stack.engine, item_workflow_id("tests", key))
    assert record is not None, key
    return record.view


async def _delivered(fake_provider: Any, destination: Any) -> list[dict[str, Any]]:
    return await fake_provider.admin.deliveries(endpoint=destination.name)


@pytest.mark.parametrize("mode", MODES)
async def test_latest_delivers_the_last_payload_once_and_supersedes_the_others(
    stack_factory: Any, fake_provider: Any, mode: str
) -> None:
    stack, destination = await _stack(stack_factory, fake_provider, mode)
    debounce_key = unique_name("profile")
    keys = [await _enqueue(stack, destination, debounce_key, n) for n in (1, 2, 3)]

    assert await _windows_closed(stack, destination, debounce_key) == 1
    carrier = item_workflow_id("tests", keys[-1])
    await until_settled(stack, [item_workflow_id("tests", key) for key in keys])

    delivered = await _delivered(fake_provider, destination)
    assert [entry["payload"] for entry in delivered] == [{"n": 3}]
    assert delivered[0]["key"] == provider_idempotency_key(carrier)
    assert _row(stack, keys[-1]).status is ItemStatus.SENT
    for key in keys[:-1]:
        row = _row(stack, key)
        assert (row.status, row.superseded_by, row.debounce_key) == (
            ItemStatus.SUPERSEDED,
            carrier,
            debounce_key,
        )
        events = store.item_events(stack.engine, row.id)
        assert [event.type for event in events] == ["enqueued", "superseded"]


@pytest.mark.parametrize("mode", MODES)
async def test_collect_delivers_every_payload_as_one_json_array_in_enqueue_order(
    stack_factory: Any, fake_provider: Any, mode: str
) -> None:
    stack, destination = await _stack(stack_factory, fake_provider, mode)
    debounce_key = unique_name("digest")
    keys = [
        await _enqueue(stack, destination, debounce_key, n, debounce_mode="collect")
        for n in (1, 2, 3, 4)
    ]

    assert await _windows_closed(stack, destination, debounce_key) == 1
    await until_settled(stack, [item_workflow_id("tests", key) for key in keys])

    delivered = await _delivered(fake_provider, destination)
    assert [entry["payload"] for entry in delivered] == [[{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]]
    assert [_row(stack, key).status for key in keys] == [ItemStatus.SUPERSEDED] * 3 + [
        ItemStatus.SENT
    ]


async def test_max_wait_caps_a_window_that_keeps_being_extended(
    stack_factory: Any, fake_provider: Any
) -> None:
    stack, destination = await _stack(stack_factory, fake_provider, "item")
    debounce_key = unique_name("cap")
    first = await _enqueue(stack, destination, debounce_key, 1, debounce_s=10, max_wait_s=15)
    await stack.env.sleep(8)
    second = await _enqueue(stack, destination, debounce_key, 2, debounce_s=10, max_wait_s=15)

    window = await _window(stack, destination, debounce_key)
    assert window.keys == [first, second]
    assert window.opened_at is not None and window.closes_at is not None
    # The second item would hold it open until 18 s; the cap closes it at 15 s.
    assert window.closes_at - window.opened_at == timedelta(seconds=15)

    assert await _windows_closed(stack, destination, debounce_key) == 1
    await until_settled(stack, [item_workflow_id("tests", key) for key in (first, second)])
    assert _row(stack, first).superseded_by == item_workflow_id("tests", second)
    delivered = await _delivered(fake_provider, destination)
    assert [entry["payload"] for entry in delivered] == [{"n": 2}]


async def test_a_repeated_member_is_the_same_member_and_another_request_conflicts(
    stack_factory: Any, fake_provider: Any
) -> None:
    stack, destination = await _stack(stack_factory, fake_provider, "item")
    debounce_key = unique_name("repeat")
    key = await _enqueue(stack, destination, debounce_key, 1)
    again = await stack.outbox.enqueue(
        "tests", destination.name, {"n": 1}, key=key, debounce_key=debounce_key, debounce_s=30
    )
    assert again.created is False
    with pytest.raises(IdempotencyConflict):
        await stack.outbox.enqueue(
            "tests", destination.name, {"n": 9}, key=key, debounce_key=debounce_key, debounce_s=30
        )
    with pytest.raises(InvalidRequest, match="debounce_mode"):
        await _enqueue(stack, destination, debounce_key, 2, debounce_mode="collect")

    assert (await _window(stack, destination, debounce_key)).keys == [key]
    assert await _windows_closed(stack, destination, debounce_key) == 1
    await until_settled(stack, [item_workflow_id("tests", key)])
    assert [entry["payload"] for entry in await _delivered(fake_provider, destination)] == [
        {"n": 1}
    ]


async def test_cancelling_every_member_ends_the_window_with_nothing_delivered(
    stack_factory: Any, fake_provider: Any
) -> None:
    stack, destination = await _stack(stack_factory, fake_provider, "item")
    writer = ProjectionWriter(stack.engine)
    debounce_key = unique_name("gone")
    keys = [
        await _enqueue(stack, destination, debounce_key, n, record_queued=_record(writer))
        for n in (1, 2)
    ]

    for key in keys:
        view = _row(stack, key)
        cancelled = await stack.outbox.cancel("tests", key, "not needed", known=view)
        assert isinstance(cancelled, OutboxItemView)
        assert cancelled.status is ItemStatus.CANCELLED

    assert await _windows_closed(stack, destination, debounce_key) == 0
    assert await _delivered(fake_provider, destination) == []
    for key in keys:
        assert _row(stack, key).status is ItemStatus.CANCELLED


async def test_a_window_whose_carrier_is_refused_ends_its_items_failed_not_retrying(
    stack_factory: Any, fake_provider: Any
) -> None:
    # Two requests raced for the carrier's key: a plain item took it with another payload
    # before the window closed. The hand-over can never succeed; the window says so and ends.
    stack, destination = await _stack(stack_factory, fake_provider, "item")
    writer = ProjectionWriter(stack.engine)
    debounce_key = unique_name("raced")
    first, carrier = [
        await _enqueue(
            stack,
            destination,
            debounce_key,
            n,
            debounce_mode="collect",
            record_queued=_record(writer),
        )
        for n in (1, 2)
    ]
    await stack.outbox.enqueue("tests", destination.name, {"plain": True}, key=carrier)

    assert await _windows_closed(stack, destination, debounce_key) == 1
    await until_settled(stack, [item_workflow_id("tests", carrier)])

    row = _row(stack, first)
    assert row.status is ItemStatus.FAILED and row.superseded_by is None
    assert row.last_error is not None
    assert f"debounce window's carrier {carrier} was refused" in row.last_error
    # The carrier's key is the plain item's: delivered once, its row its own.
    assert _row(stack, carrier).status is ItemStatus.SENT
    delivered = await _delivered(fake_provider, destination)
    assert [entry["payload"] for entry in delivered] == [{"plain": True}]


def _record(writer: ProjectionWriter) -> Any:
    async def record(item_id: str, item: Any) -> None:
        await writer.write(transitions.enqueued(item_id, item))

    return record


async def test_a_window_survives_its_workers_stopping_and_new_ones_close_it(
    dev_env: Any, stack_factory: Any, fake_provider: Any
) -> None:
    destination = webhook_destination(fake_provider)
    first = await stack_factory(destination, env=dev_env)
    debounce_key = unique_name("durable")
    keys = [await _enqueue(first, destination, debounce_key, n, debounce_s=2) for n in (1, 2)]
    # Every worker stops with the window open (as a kill -9 would leave it): the window's state
    # and its timer are the server's, so new workers on the same queues close it.
    await first.shutdown()
    second = await stack_factory(destination, env=dev_env, task_queue=first.task_queue)

    assert await _windows_closed(second, destination, debounce_key) == 1
    carried = await second.result(item_workflow_id("tests", keys[-1]))

    assert carried.status is ItemStatus.SENT
    assert [entry["payload"] for entry in await _delivered(fake_provider, destination)] == [
        {"n": 2}
    ]
    assert _row(second, keys[0]).superseded_by == carried.id
