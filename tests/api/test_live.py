"""The live feed over a real WebSocket: backfill, new events, reconnects, auth, slow clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import uuid
from typing import Any

import httpx
import pytest
import websockets
from durable_outbox_temporal.contract.item import ItemEventType, ItemProjection, ItemStatus
from sqlalchemy import Engine
from sqlalchemy import event as sa_event

from api.live import SUBSCRIBER_BUFFER, LiveHub, SubscriberTooSlow
from readmodel import aggregates as event_store
from readmodel import store
from tests.api.conftest import ServedApi
from tests.readmodel.test_aggregate_store import batch
from tests.readmodel.test_store import event, view


async def enqueue(api: ServedApi, key: str, outbox: str = "live") -> str:
    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {"key": key}},
            headers={"Idempotency-Key": key},
        )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def ws_url(api: ServedApi, query: str, outbox: str = "live") -> str:
    return api.url.replace("http://", "ws://") + f"/v1/outboxes/{outbox}/live?{query}"


async def receive(socket: Any, count: int) -> list[dict[str, Any]]:
    return [json.loads(await asyncio.wait_for(socket.recv(), timeout=10)) for _ in range(count)]


async def test_backfill_then_live_then_resume_without_gaps_or_duplicates(
    served_api_factory,
) -> None:
    api = await served_api_factory()
    first = await enqueue(api, "one")
    await api.stack.result(first)

    async with websockets.connect(ws_url(api, "since=0")) as socket:
        backfilled = await receive(socket, 2)
        second = await enqueue(api, "two")
        live = await receive(socket, 2)
    third = await enqueue(api, "three")
    await api.stack.result(third)
    async with websockets.connect(ws_url(api, f"since={live[-1]['id']}")) as socket:
        resumed = await receive(socket, 2)

    assert [(e["key"], e["type"]) for e in backfilled] == [("one", "enqueued"), ("one", "sent")]
    assert [(e["item_id"], e["type"]) for e in live] == [(second, "enqueued"), (second, "sent")]
    assert [(e["key"], e["type"]) for e in resumed] == [("three", "enqueued"), ("three", "sent")]
    ids = [e["id"] for e in backfilled + live + resumed]
    assert ids == sorted(ids) and len(set(ids)) == 6


async def test_without_since_only_new_events_arrive(served_api_factory) -> None:
    api = await served_api_factory()
    await api.stack.result(await enqueue(api, "old", outbox="fresh"))

    async with websockets.connect(ws_url(api, "", outbox="fresh")) as socket:
        await asyncio.sleep(0.3)  # let the subscription start before the next item
        await enqueue(api, "new", outbox="fresh")
        events = await receive(socket, 2)

    assert {e["key"] for e in events} == {"new"}


async def test_an_event_committed_as_the_socket_opens_arrives(served_api_factory) -> None:
    """The stream's start is fixed before the accept, so a client that loads a page once the
    socket is open (the dashboard does) misses nothing committed after the open."""
    api = await served_api_factory()
    for n in range(5):
        outbox = f"opening-{n}"
        async with websockets.connect(ws_url(api, "", outbox=outbox)) as socket:
            store.apply_projection(
                api.stack.engine,
                ItemProjection(
                    view("k", 1, ItemStatus.QUEUED, outbox=outbox),
                    [event(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED)],
                ),
            )
            [arrived] = await receive(socket, 1)
        assert (arrived["outbox"], arrived["seq"]) == (outbox, 1)


async def test_websocket_requires_the_token_when_configured(served_api_factory) -> None:
    api = await served_api_factory(api_token="s3cret")
    # What the dashboard offers: the token as a subprotocol, out of URLs and access logs.
    subprotocols = ["bearer", "bearer." + base64.urlsafe_b64encode(b"s3cret").decode().rstrip("=")]

    with pytest.raises(websockets.exceptions.InvalidStatus):
        async with websockets.connect(ws_url(api, "since=0")):
            pass
    async with websockets.connect(ws_url(api, "since=0"), subprotocols=subprotocols) as socket:
        assert socket.state.name == "OPEN" and socket.subprotocol == "bearer"
    headers = {"Authorization": "Bearer s3cret"}
    async with websockets.connect(ws_url(api, "since=0"), additional_headers=headers) as socket:
        assert socket.state.name == "OPEN"
    # Tools may still put it in the query (the access log shows `token=***`).
    async with websockets.connect(ws_url(api, "since=0&token=s3cret")) as socket:
        assert socket.state.name == "OPEN"


async def test_a_slow_subscriber_is_dropped_and_others_keep_up(engine: Engine) -> None:
    hub = LiveHub(engine)
    slow = await hub.subscribe("o")
    fast = await hub.subscribe("o")
    count, chunk = SUBSCRIBER_BUFFER + 5, 500

    async def consume_fast() -> list[Any]:
        return [await asyncio.wait_for(fast.next(), timeout=10) for _ in range(count)]

    consumer = asyncio.create_task(consume_fast())
    for start in range(1, count + 1, chunk):
        seqs = range(start, min(start + chunk, count + 1))
        events = [event(seq, ItemEventType.POLLED, ItemStatus.SENDING) for seq in seqs]
        projection = ItemProjection(view("k", seqs[-1], ItemStatus.SENDING), events)
        await asyncio.to_thread(store.apply_projection, engine, projection)

    received = await consumer

    assert [e.seq for e in received] == list(range(1, count + 1))
    with pytest.raises(SubscriberTooSlow):
        for _ in range(count):
            await asyncio.wait_for(slow.next(), timeout=10)
    await hub.close()


async def test_aggregate_stream_backfills_pushes_and_resumes_by_seq(served_api_factory) -> None:
    api = await served_api_factory()
    flight = f"live-{uuid.uuid4().hex[:6]}"
    base = f"/v1/aggregates/flight/{flight}"
    socket_url = api.url.replace("http://", "ws://") + f"{base}/live"

    async with httpx.AsyncClient(base_url=api.url) as http:
        await http.post(f"{base}/commands/open", json={"seats": ["1A", "1B"]})
        async with websockets.connect(f"{socket_url}?since=0") as socket:
            backfilled = await receive(socket, 1)
            await http.post(
                f"{base}/commands/assign_seat", json={"seat": "1A", "passenger_id": "p1"}
            )
            pushed = await receive(socket, 1)
        await http.post(f"{base}/commands/move_seat", json={"passenger_id": "p1", "to": "1B"})
        async with websockets.connect(f"{socket_url}?since=2") as socket:
            resumed = await receive(socket, 2)
        # An invalid id (or type) is refused before the socket opens.
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(socket_url.replace(flight, "a" * 201)):
                pass

    assert [(e["seq"], e["type"]) for e in backfilled] == [(1, "FlightOpened")]
    assert [(e["seq"], e["type"]) for e in pushed] == [(2, "SeatAssigned")]
    assert [(e["seq"], e["type"]) for e in resumed] == [(3, "SeatReleased"), (4, "SeatAssigned")]


# --- bounded: socket limits, one tailer, no leftovers ---------------------------------------


async def test_sockets_past_the_token_or_process_limit_are_refused_with_retry_after(
    served_api_factory,
) -> None:
    api = await served_api_factory(
        api_token="first-token, second-token, third-token",
        live_sockets_per_token=2,
        live_sockets_max=3,
    )

    def as_token(token: str) -> dict[str, Any]:
        return {"additional_headers": {"Authorization": f"Bearer {token}"}}

    async with contextlib.AsyncExitStack() as sockets:
        for _ in range(2):
            await sockets.enter_async_context(
                websockets.connect(ws_url(api, ""), **as_token("first-token"))
            )
        with pytest.raises(websockets.InvalidStatus) as per_token:
            await websockets.connect(ws_url(api, ""), **as_token("first-token"))
        await sockets.enter_async_context(
            websockets.connect(ws_url(api, ""), **as_token("second-token"))
        )
        with pytest.raises(websockets.InvalidStatus) as per_process:
            await websockets.connect(ws_url(api, ""), **as_token("third-token"))

        for refused, limit in (
            (per_token, "LIVE_SOCKETS_PER_TOKEN"),
            (per_process, "LIVE_SOCKETS_MAX"),
        ):
            response = refused.value.response
            assert response.status_code == 429
            assert int(response.headers["Retry-After"]) > 0
            assert limit in json.loads(response.body)["detail"]
    # Closed sockets give their slots back.
    async with websockets.connect(ws_url(api, ""), **as_token("third-token")) as socket:
        assert socket.state.name == "OPEN"


async def test_one_tailer_reads_for_every_outbox_in_one_query_a_poll(engine: Engine) -> None:
    hub = LiveHub(engine)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "FROM outbox_events" in statement and "max(" not in statement:
            statements.append(statement)

    subscriptions = [await hub.subscribe(f"many-{n}") for n in range(30)]
    sa_event.listen(engine, "before_cursor_execute", record)
    try:
        start = hub.polls
        projection = ItemProjection(
            view("k", 1, ItemStatus.QUEUED, "many-7"),
            [event(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED)],
        )
        await asyncio.to_thread(store.apply_projection, engine, projection)
        got = await asyncio.wait_for(subscriptions[7].next(), timeout=10)
        polls = hub.polls - start
    finally:
        sa_event.remove(engine, "before_cursor_execute", record)

    assert got.outbox == "many-7" and hub.tailers == 1
    assert len(statements) <= polls + 1  # one query a poll, not one per outbox
    await hub.close()
    assert hub.tailers == 0


async def test_one_tailer_reads_for_every_aggregate_in_one_query_a_poll(engine: Engine) -> None:
    hub = LiveHub(engine)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "FROM aggregate_events" in statement:
            statements.append(statement)

    subscriptions = [hub.subscribe_aggregate(("flight", f"many-{n}"), 0) for n in range(30)]
    sa_event.listen(engine, "before_cursor_execute", record)
    try:
        start = hub.polls
        await asyncio.to_thread(event_store.store_events, engine, batch(1, 2, "many-7"))
        got = [await asyncio.wait_for(subscriptions[7].next(), timeout=10) for _ in range(2)]
        polls = hub.polls - start
    finally:
        sa_event.remove(engine, "before_cursor_execute", record)

    assert [event.seq for event in got] == [1, 2] and hub.tailers == 1
    assert subscriptions[8].queue.empty()
    assert len(statements) <= polls + 1  # one query a poll, not one per aggregate or socket
    await hub.close()
    assert hub.tailers == 0


def _stream_tasks() -> list[asyncio.Task[Any]]:
    names = ("Subscription.next", "Queue.get", "Event.wait", "_until_disconnect")
    return [
        task
        for task in asyncio.all_tasks()
        if any(name in getattr(task.get_coro(), "__qualname__", "") for name in names)
    ]


async def test_a_closed_socket_leaves_no_task_and_logs_no_error(
    served_api_factory, caplog: pytest.LogCaptureFixture
) -> None:
    api = await served_api_factory()
    before = set(_stream_tasks())
    with caplog.at_level("WARNING"):
        for n in range(20):
            async with websockets.connect(ws_url(api, "since=0", outbox=f"closing-{n % 4}")):
                pass
        for _ in range(500):  # the server notices each close as its receive ends
            if not set(_stream_tasks()) - before:
                break
            await asyncio.sleep(0.01)
        gc.collect()

    assert set(_stream_tasks()) - before == set()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_aggregate_sockets_only_for_aggregates_that_exist(served_api_factory) -> None:
    api = await served_api_factory()
    base = api.url.replace("http://", "ws://") + "/v1/aggregates/flight"

    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"{base}/never-opened/live"):
            pass
    assert refused.value.response.status_code == 403
    async with httpx.AsyncClient(base_url=api.url) as http:
        await http.post("/v1/aggregates/flight/opened/commands/open", json={"seats": ["1A"]})
    async with websockets.connect(f"{base}/opened/live?since=0") as socket:
        assert [e["type"] for e in await receive(socket, 1)] == ["FlightOpened"]
