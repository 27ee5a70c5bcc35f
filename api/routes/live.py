"""Live streams: `WS /v1/outboxes/{outbox}/live?since=ID` (an outbox's item events) and
`WS /v1/aggregates/{type}/{id}/live?since=SEQ` (one aggregate's events): backfill after
`since`, then every new event.

A browser passes its token as the subprotocols `bearer` and `bearer.<base64url token>` (see
`api.auth`); a page of another origin is refused. A `since` that is no event id closes the socket
with 1008 and says why; so does an aggregate that does not exist (yet).

Bounded (`api.live.SocketLimits`): past `LIVE_SOCKETS_PER_TOKEN` sockets of one token, or
`LIVE_SOCKETS_MAX` of the process, the handshake is answered 429 with `Retry-After` (a server
that cannot answer a handshake with HTTP accepts and closes with 1013). A client that does not
read what it is sent is dropped with 1013 and the id to resume from.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from durable_outbox_temporal import InvalidRequest, OutboxError, validate_outbox
from durable_outbox_temporal.contract.aggregate import RecordedEvent
from durable_outbox_temporal.contract.ids import parse_item_workflow_id
from fastapi import APIRouter, WebSocket, WebSocketDisconnect, status
from pydantic import TypeAdapter

from api.auth import websocket_refusal, websocket_subprotocol, websocket_token
from api.errors import ApiProblem, problem_response
from api.live import Event, LiveHub, SocketLimits, SubscriberTooSlow, Subscription
from readmodel import aggregates as event_store
from readmodel import store
from readmodel.models import EventRecord

router = APIRouter(tags=["live"])

_BACKFILL_PAGE = 500
# Event ids and sequence numbers are 64-bit signed integers in the read model.
_MAX_POSITION = 2**63 - 1
_EVENT_JSON = TypeAdapter(EventRecord)
# How long one message may take to leave: a client that reads nothing fills its connection's
# buffers, and is then dropped rather than held open.
SEND_TIMEOUT_S = 10.0
# What a refused client is told to wait before it tries again.
RETRY_AFTER_S = 5


def event_message(event: EventRecord) -> dict[str, Any]:
    """What a socket receives per event: the event as the REST history shows it, plus the item's
    key; `id` is what to pass as `since` when reconnecting."""
    _, key = parse_item_workflow_id(event.item_id)
    return {**_EVENT_JSON.dump_python(event, mode="json"), "key": key}


@router.websocket("/v1/outboxes/{outbox}/live")
async def live(websocket: WebSocket, outbox: str, since: int | None = None) -> None:
    """Every event after `since` (none without it), in order, then each new one as it happens."""
    if not await _admitted(websocket, outbox, since):
        return
    try:
        validate_outbox(outbox)
    except InvalidRequest as err:
        await websocket.close(code=status.WS_1008_POLICY_VIOLATION, reason=str(err))
        return
    async with _socket_slot(websocket) as admitted:
        if admitted:
            await _stream_outbox(websocket, outbox, since)


async def _stream_outbox(websocket: WebSocket, outbox: str, since: int | None) -> None:
    hub: LiveHub = websocket.app.state.live
    engine = websocket.app.state.resources.engine
    # Subscribe before backfilling, so nothing committed in between can fall through the gap;
    # duplicates from the overlap are dropped by id. Both happen before the accept: a client
    # that loads a page once the socket is open (the dashboard) then misses nothing.
    subscription = await hub.subscribe(outbox)
    try:
        if since is None:
            last = await asyncio.to_thread(store.last_event_id, engine, outbox)
        else:
            last = since
        await websocket.accept(subprotocol=websocket_subprotocol(websocket))

        async def backfill(after: int) -> list[EventRecord]:
            return await asyncio.to_thread(
                store.events_since, engine, outbox, after, _BACKFILL_PAGE
            )

        async def message(event: EventRecord) -> dict[str, Any]:
            return event_message(event)

        await _pump(
            websocket,
            subscription,
            last,
            backfill=None if since is None else backfill,
            position=lambda event: event.id,
            message=message,
        )
    finally:
        hub.unsubscribe(outbox, subscription)


async def _pump(
    websocket: WebSocket,
    subscription: Subscription[Event],
    last: int,
    *,
    backfill: Callable[[int], Awaitable[list[Event]]] | None,
    position: Callable[[Event], int],
    message: Callable[[Event], Awaitable[dict[str, Any]]],
) -> None:
    """Send the stored events after `last` page by page (with `backfill`), then each one the
    tailer brings, skipping what was sent already; a client too slow is closed with 1013 and the
    position to resume from."""
    disconnected = asyncio.ensure_future(_until_disconnect(websocket))
    upcoming: asyncio.Future[Event] | None = None
    try:
        while backfill is not None:
            page = await backfill(last)
            for event in page:
                await _send(websocket, await message(event))
                last = position(event)
            if len(page) < _BACKFILL_PAGE:
                break
        while True:
            upcoming = asyncio.ensure_future(subscription.next())
            await asyncio.wait({upcoming, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            if disconnected.done():
                return
            event = upcoming.result()
            if position(event) <= last:
                continue
            await _send(websocket, await message(event))
            last = position(event)
    except SubscriberTooSlow:
        await _close(websocket, status.WS_1013_TRY_AGAIN_LATER, f"reconnect with since={last}")
    except WebSocketDisconnect:
        pass
    finally:
        await _finish(disconnected, upcoming)


async def _admitted(websocket: WebSocket, outbox: str | None, since: int | None) -> bool:
    """Whether the stream may open; if not, the socket is closed saying why (a refused token or
    origin before the handshake completes, a bad `since` with 1008 and a reason)."""
    origins = websocket.app.state.resources.settings.websocket_origins_list
    refused = websocket_refusal(websocket, outbox, origins)
    if refused is not None:
        await websocket.close(code=status.WS_1008_POLICY_VIOLATION, reason=refused)
        return False
    if since is not None and not 0 <= since <= _MAX_POSITION:
        await websocket.accept(subprotocol=websocket_subprotocol(websocket))
        await websocket.close(
            code=status.WS_1008_POLICY_VIOLATION,
            reason=f"since must be an event id from 0 to {_MAX_POSITION}",
        )
        return False
    return True


@contextlib.asynccontextmanager
async def _socket_slot(websocket: WebSocket) -> AsyncIterator[bool]:
    """A slot under the socket limits for the stream's whole life; False (the handshake answered
    429) when the token or the process holds its most."""
    limits: SocketLimits = websocket.app.state.live.limits
    holder = _holder(websocket)
    refused = limits.acquire(holder)
    if refused is not None:
        await _refuse_busy(websocket, refused)
        yield False
        return
    try:
        yield True
    finally:
        limits.release(holder)


def _holder(websocket: WebSocket) -> str:
    """Whose sockets these count as: the token's, or without tokens the client address's."""
    token = websocket_token(websocket)
    if token is not None:
        return f"token:{token.name}"
    client = websocket.client
    return f"address:{client.host if client else '?'}"


async def _refuse_busy(websocket: WebSocket, why: str) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        problem = ApiProblem(
            429,
            "rate-limited",
            "Too many live sockets",
            f"{why}; close one, or try again later",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
        await websocket.send_denial_response(problem_response(None, problem))
        return
    await websocket.accept(subprotocol=websocket_subprotocol(websocket))
    await _close(websocket, status.WS_1013_TRY_AGAIN_LATER, f"{why}; retry after {RETRY_AFTER_S} s")


async def _send(websocket: WebSocket, message: dict[str, Any]) -> None:
    try:
        await asyncio.wait_for(websocket.send_json(message), SEND_TIMEOUT_S)
    except TimeoutError as err:
        raise SubscriberTooSlow from err


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    """Close saying why, unless the client is gone or no longer reads (then just end)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(websocket.close(code=code, reason=reason), SEND_TIMEOUT_S)


async def _finish(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel the stream's helper tasks and wait for them: none outlives its socket."""
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _until_disconnect(websocket: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return


_AGGREGATE_EVENT_JSON = TypeAdapter(RecordedEvent)


@router.websocket("/v1/aggregates/{aggregate_type}/{aggregate_id}/live")
async def aggregate_live(
    websocket: WebSocket, aggregate_type: str, aggregate_id: str, since: int | None = None
) -> None:
    """The aggregate's events with seq > `since` (from its current version without it), in
    order, then each new one as the event store receives it; reconnect with the last seq."""
    if not await _admitted(websocket, None, since):
        return
    resources = websocket.app.state.resources
    try:
        resources.aggregates.client.check(aggregate_type, aggregate_id)
    except OutboxError as err:
        await websocket.close(code=status.WS_1008_POLICY_VIOLATION, reason=str(err))
        return
    record = await asyncio.to_thread(
        event_store.get, resources.engine, aggregate_type, aggregate_id
    )
    if record is None:
        # Sockets for ids that do not exist would each poll for nothing.
        await websocket.close(
            code=status.WS_1008_POLICY_VIOLATION,
            reason=f"no aggregate {aggregate_type}/{aggregate_id}: open it once it has an event",
        )
        return
    async with _socket_slot(websocket) as admitted:
        if admitted:
            await _stream_aggregate(
                websocket,
                aggregate_type,
                aggregate_id,
                record.version,
                record.version if since is None else since,
            )


async def _stream_aggregate(
    websocket: WebSocket, aggregate_type: str, aggregate_id: str, version: int, since: int
) -> None:
    resources = websocket.app.state.resources
    hub: LiveHub = websocket.app.state.live
    key = (aggregate_type, aggregate_id)
    # As for an outbox: subscribed before the backfill, the overlap dropped by seq.
    subscription = hub.subscribe_aggregate(key, version)
    try:
        await websocket.accept(subprotocol=websocket_subprotocol(websocket))

        async def backfill(after: int) -> list[RecordedEvent]:
            return await asyncio.to_thread(
                event_store.events,
                resources.engine,
                aggregate_type,
                aggregate_id,
                after=after,
                limit=_BACKFILL_PAGE,
            )

        async def message(event: RecordedEvent) -> dict[str, Any]:
            # Secret fields redacted, as for any reader the aggregate does not entitle.
            (shown,) = await resources.aggregates.visible(aggregate_type, aggregate_id, [event])
            return dict(_AGGREGATE_EVENT_JSON.dump_python(shown, mode="json"))

        await _pump(
            websocket,
            subscription,
            since,
            # Always: events stored between reading `version` and subscribing may have been
            # fanned out already, to the aggregate's other sockets only.
            backfill=backfill,
            position=lambda event: event.seq,
            message=message,
        )
    finally:
        hub.unsubscribe_aggregate(key, subscription)
