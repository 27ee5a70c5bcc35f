"""Each route a service calls, as a request to send and a parser for its answer.

Shared by the sync and the async client, which differ only in how they send; so the URL
scheme, the headers and the parsing live here once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from durable_outbox_rest.models import (
    AggregateView,
    BatchEnqueued,
    CancelRequested,
    CommandResult,
    DeadLetter,
    DeadLetterPage,
    Destination,
    Enqueued,
    Item,
    ItemEvent,
    ItemPage,
    Lane,
    LanePage,
    NewItem,
    RedriveBatch,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request to the API and how to read its successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def enqueue(outbox: str, item: NewItem) -> Call[Enqueued]:
    """`POST /v1/outboxes/{outbox}/items`; the item's key goes as `Idempotency-Key`."""
    body = item.model_dump(mode="json", exclude_none=True, exclude={"idempotency_key"})
    key = item.idempotency_key or _new_key()
    return _post(
        f"{_outbox(outbox)}/items", _model(Enqueued), body, headers={"Idempotency-Key": key}
    )


def enqueue_batch(outbox: str, items: Iterable[NewItem]) -> Call[BatchEnqueued]:
    """`POST /v1/outboxes/{outbox}/items:batch`: up to 100 items, each with its own outcome."""
    body = [
        item.model_dump(mode="json", exclude_none=True)
        | {"idempotency_key": item.idempotency_key or _new_key()}
        for item in items
    ]
    return _post(f"{_outbox(outbox)}/items:batch", _model(BatchEnqueued), {"items": body})


def get_item(outbox: str, key: str) -> Call[Item]:
    """`GET .../items/{key}`: live while it runs, from the read model after."""
    return Call("GET", _item(outbox, key), _model(Item))


def item_events(outbox: str, key: str) -> Call[list[ItemEvent]]:
    """`GET .../items/{key}/events`: its transitions, oldest first."""
    return Call("GET", f"{_item(outbox, key)}/events", _list(ItemEvent))


def list_items(outbox: str, filters: Mapping[str, Any], cursor: str | None) -> Call[ItemPage]:
    """`GET .../items`: one page, newest first."""
    params = _params({**filters, "cursor": cursor})
    return Call("GET", f"{_outbox(outbox)}/items", _model(ItemPage), params=params)


def cancel(outbox: str, key: str, reason: str | None) -> Call[Item | CancelRequested]:
    """`POST .../items/{key}/cancel`: the cancelled item, or 202 when no worker answered."""

    def parse(response: httpx.Response) -> Item | CancelRequested:
        if response.status_code == httpx.codes.ACCEPTED:
            return CancelRequested.model_validate(response.json())
        return Item.model_validate(response.json())

    body = None if reason is None else {"reason": reason}
    return _post(f"{_item(outbox, key)}/cancel", parse, body)


def redrive(outbox: str, key: str) -> Call[Enqueued]:
    """`POST .../items/{key}/redrive`: a failed item runs again under the same id."""
    return _post(f"{_item(outbox, key)}/redrive", _model(Enqueued), None)


def list_dead_letters(
    outbox: str, filters: Mapping[str, Any], cursor: str | None
) -> Call[DeadLetterPage]:
    """`GET .../dead-letters`: one page, newest failure first."""
    params = _params({**filters, "cursor": cursor})
    return Call("GET", f"{_outbox(outbox)}/dead-letters", _model(DeadLetterPage), params=params)


def discard_dead_letter(outbox: str, key: str, reason: str | None) -> Call[DeadLetter]:
    """`POST .../dead-letters/{key}/discard`: give up on a failed item, keeping its history."""
    body = None if reason is None else {"reason": reason}
    path = f"{_outbox(outbox)}/dead-letters/{_segment(key)}/discard"
    return _post(path, _model(DeadLetter), body)


def redrive_dead_letters(outbox: str, selection: Mapping[str, Any]) -> Call[RedriveBatch]:
    """`POST .../dead-letters:redrive`: start a batch redriving every dead letter selected."""
    body = {name: _json_value(value) for name, value in selection.items() if value is not None}
    return _post(f"{_outbox(outbox)}/dead-letters:redrive", _model(RedriveBatch), body or None)


def redrive_batch(outbox: str, batch_id: str) -> Call[RedriveBatch]:
    """`GET .../redrive-batches/{id}`: a redrive batch's progress."""
    return Call(
        "GET", f"{_outbox(outbox)}/redrive-batches/{_segment(batch_id)}", _model(RedriveBatch)
    )


def get_destination(name: str) -> Call[Destination]:
    """`GET /v1/destinations/{name}`, with its throttle and circuit at work."""
    return Call("GET", f"/v1/destinations/{_segment(name)}", _model(Destination))


def list_destinations() -> Call[list[Destination]]:
    """`GET /v1/destinations`: every configured destination with its rates in force."""
    return Call("GET", "/v1/destinations", _list(Destination))


def get_lane(outbox: str, ordering_key: str) -> Call[Lane]:
    """`GET .../lanes/{ordering_key}`: live while it runs, from the read model after."""
    return Call("GET", f"{_outbox(outbox)}/lanes/{_segment(ordering_key)}", _model(Lane))


def list_lanes(outbox: str, filters: Mapping[str, Any], cursor: str | None) -> Call[LanePage]:
    """`GET .../lanes`: one page by ordering key."""
    params = _params({**filters, "cursor": cursor})
    return Call("GET", f"{_outbox(outbox)}/lanes", _model(LanePage), params=params)


def command(
    aggregate_type: str,
    aggregate_id: str,
    name: str,
    payload: Mapping[str, Any],
    command_id: str | None,
    expected_version: int | None,
) -> Call[CommandResult]:
    """`POST /v1/aggregates/{type}/{id}/commands/{name}`; the command id is `Idempotency-Key`."""
    path = f"{_aggregate(aggregate_type, aggregate_id)}/commands/{_segment(name)}"
    return _post(
        path,
        _model(CommandResult),
        dict(payload),
        params=_params({"expected_version": expected_version}),
        headers={"Idempotency-Key": command_id or _new_key()},
    )


def get_aggregate(aggregate_type: str, aggregate_id: str, actor: str | None) -> Call[AggregateView]:
    """`GET /v1/aggregates/{type}/{id}`: state and version (`actor`: read as that actor)."""
    path = _aggregate(aggregate_type, aggregate_id)
    return Call("GET", path, _model(AggregateView), params=_params({"actor": actor}))


def _post(
    path: str,
    parse: Callable[[httpx.Response], T],
    body: Any,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Call[T]:
    # The API takes a POST only as JSON (415 otherwise), a body-less one too.
    return Call(
        "POST",
        path,
        parse,
        params=params or {},
        json=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: model.model_validate(response.json())


def _list(model: type[M]) -> Callable[[httpx.Response], list[M]]:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return lambda response: adapter.validate_python(response.json())


def _new_key() -> str:
    # Generated here rather than by the API, so a retried enqueue or command is the same one.
    return str(uuid.uuid4())


def _segment(value: str) -> str:
    """A path segment: keys may hold `/`, `:`, `?` or spaces."""
    return quote(value, safe="")


def _outbox(outbox: str) -> str:
    return f"/v1/outboxes/{_segment(outbox)}"


def _item(outbox: str, key: str) -> str:
    return f"{_outbox(outbox)}/items/{_segment(key)}"


def _aggregate(aggregate_type: str, aggregate_id: str) -> str:
    return f"/v1/aggregates/{_segment(aggregate_type)}/{_segment(aggregate_id)}"


def _params(values: Mapping[str, Any]) -> dict[str, str]:
    return {name: _query_value(value) for name, value in values.items() if value is not None}


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(_json_value(value))


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
