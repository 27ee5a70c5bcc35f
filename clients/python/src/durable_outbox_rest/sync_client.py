"""`OutboxRest`: the blocking client, for scripts, workers and sync web frameworks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from durable_outbox_rest import calls
from durable_outbox_rest.calls import Call
from durable_outbox_rest.errors import problem_error
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
from durable_outbox_rest.retry import NO_RETRY, RetryPolicy
from durable_outbox_rest.session import DEFAULT_TIMEOUT_S, request_headers

T = TypeVar("T")


class OutboxRest:
    """The durable-outbox REST API over httpx; errors raise `ProblemError` subclasses.

    `token` is sent as `Authorization: Bearer`; `retry` retries 429 and 503 as their
    `Retry-After` says (none by default). Pass `http_client` to share a connection pool (its
    own base URL and headers are not used); `sleep` is how a retry waits.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy = NO_RETRY,
        http_client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self._headers = request_headers(token)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)
        self._sleep = sleep

    def close(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # Items

    def enqueue(
        self,
        outbox: str,
        destination: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        not_before: datetime | None = None,
        delay_seconds: float | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        debounce_key: str | None = None,
        debounce_s: float | None = None,
        debounce_mode: str | None = None,
        max_wait_s: float | None = None,
        subject: str | None = None,
    ) -> Enqueued:
        """Hand one item to the outbox; repeating `idempotency_key` returns the same item
        (`created` false), another payload under it raises `Conflict`."""
        item = NewItem(
            destination=destination,
            payload=dict(payload),
            idempotency_key=idempotency_key,
            ordering_key=ordering_key,
            not_before=not_before,
            delay_seconds=delay_seconds,
            concurrency_key=concurrency_key,
            priority=priority,
            max_attempts=max_attempts,
            debounce_key=debounce_key,
            debounce_s=debounce_s,
            debounce_mode=debounce_mode,
            max_wait_s=max_wait_s,
            subject=subject,
        )
        return self._send(calls.enqueue(outbox, item))

    def enqueue_batch(self, outbox: str, items: Iterable[NewItem]) -> BatchEnqueued:
        """Up to 100 items in one call; each result says how that item fared."""
        return self._send(calls.enqueue_batch(outbox, items))

    def get_item(self, outbox: str, key: str) -> Item:
        """One item's status."""
        return self._send(calls.get_item(outbox, key))

    def item_events(self, outbox: str, key: str) -> list[ItemEvent]:
        """One item's history, oldest first."""
        return self._send(calls.item_events(outbox, key))

    def list_items(
        self,
        outbox: str,
        *,
        status: str | None = None,
        destination: str | None = None,
        error_code: str | None = None,
        delivery: str | None = None,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        key_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ItemPage:
        """One page of items, newest first; pass `next_cursor` back as `cursor`."""
        filters = {
            "status": status,
            "destination": destination,
            "error_code": error_code,
            "delivery": delivery,
            "created_from": created_from,
            "created_to": created_to,
            "key_prefix": key_prefix,
            "limit": limit,
        }
        return self._send(calls.list_items(outbox, filters, cursor))

    def iter_items(
        self,
        outbox: str,
        *,
        status: str | None = None,
        destination: str | None = None,
        error_code: str | None = None,
        delivery: str | None = None,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        key_prefix: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Item]:
        """Every item the filters select, newest first, fetching page after page."""
        cursor: str | None = None
        while True:
            page = self.list_items(
                outbox,
                status=status,
                destination=destination,
                error_code=error_code,
                delivery=delivery,
                created_from=created_from,
                created_to=created_to,
                key_prefix=key_prefix,
                cursor=cursor,
                limit=page_size,
            )
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, outbox: str, key: str, reason: str | None = None) -> Item | CancelRequested:
        """Cancel a queued item: the item, or `CancelRequested` when no worker answered in
        time; `Conflict` once the provider has it."""
        return self._send(calls.cancel(outbox, key, reason))

    def redrive(self, outbox: str, key: str) -> Enqueued:
        """Run a failed item again; `Conflict` unless it failed."""
        return self._send(calls.redrive(outbox, key))

    # Dead letters

    def list_dead_letters(
        self,
        outbox: str,
        *,
        destination: str | None = None,
        error_code: str | None = None,
        failed_from: datetime | None = None,
        failed_to: datetime | None = None,
        include_discarded: bool = False,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> DeadLetterPage:
        """One page of dead letters, newest failure first."""
        filters = {
            "destination": destination,
            "error_code": error_code,
            "failed_from": failed_from,
            "failed_to": failed_to,
            "include_discarded": include_discarded or None,
            "limit": limit,
        }
        return self._send(calls.list_dead_letters(outbox, filters, cursor))

    def iter_dead_letters(
        self,
        outbox: str,
        *,
        destination: str | None = None,
        error_code: str | None = None,
        failed_from: datetime | None = None,
        failed_to: datetime | None = None,
        include_discarded: bool = False,
        page_size: int | None = None,
    ) -> Iterator[DeadLetter]:
        """Every dead letter the filters select, page after page."""
        cursor: str | None = None
        while True:
            page = self.list_dead_letters(
                outbox,
                destination=destination,
                error_code=error_code,
                failed_from=failed_from,
                failed_to=failed_to,
                include_discarded=include_discarded,
                cursor=cursor,
                limit=page_size,
            )
            yield from page.dead_letters
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def discard_dead_letter(self, outbox: str, key: str, reason: str | None = None) -> DeadLetter:
        """Give up on a failed item; it keeps its history. `Conflict` unless it failed."""
        return self._send(calls.discard_dead_letter(outbox, key, reason))

    def redrive_dead_letters(
        self,
        outbox: str,
        *,
        destination: str | None = None,
        error_code: str | None = None,
        failed_from: datetime | None = None,
        failed_to: datetime | None = None,
    ) -> RedriveBatch:
        """Start a batch redriving every dead letter selected; follow it with `redrive_batch`."""
        selection = {
            "destination": destination,
            "error_code": error_code,
            "failed_from": failed_from,
            "failed_to": failed_to,
        }
        return self._send(calls.redrive_dead_letters(outbox, selection))

    def redrive_batch(self, outbox: str, batch_id: str) -> RedriveBatch:
        """A redrive batch's progress."""
        return self._send(calls.redrive_batch(outbox, batch_id))

    # Destinations and lanes

    def get_destination(self, name: str) -> Destination:
        """One destination, with its throttle and circuit at work."""
        return self._send(calls.get_destination(name))

    def list_destinations(self) -> list[Destination]:
        """Every configured destination."""
        return self._send(calls.list_destinations())

    def get_lane(self, outbox: str, ordering_key: str) -> Lane:
        """One ordering lane."""
        return self._send(calls.get_lane(outbox, ordering_key))

    def list_lanes(
        self,
        outbox: str,
        *,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> LanePage:
        """One page of the outbox's lanes (`status="halted"`: those waiting for an operator)."""
        return self._send(calls.list_lanes(outbox, {"status": status, "limit": limit}, cursor))

    # Aggregates

    def command(
        self,
        aggregate_type: str,
        aggregate_id: str,
        name: str,
        payload: Mapping[str, Any],
        *,
        command_id: str | None = None,
        expected_version: int | None = None,
    ) -> CommandResult:
        """Run a command; a repeated `command_id` answers its first outcome (`duplicate`)."""
        call = calls.command(
            aggregate_type, aggregate_id, name, payload, command_id, expected_version
        )
        return self._send(call)

    def get_aggregate(
        self, aggregate_type: str, aggregate_id: str, *, actor: str | None = None
    ) -> AggregateView:
        """An aggregate's state and version."""
        return self._send(calls.get_aggregate(aggregate_type, aggregate_id, actor))

    def _send(self, call: Call[T]) -> T:
        attempt = 1
        while True:
            response = self._http.request(
                call.method,
                self.base_url + call.path,
                params=call.params,
                json=call.json,
                headers=self._headers | call.headers,
            )
            if response.is_success:
                return call.parse(response)
            error = problem_error(response)
            delay = self.retry.delay(error, attempt)
            if delay is None:
                raise error
            self._sleep(delay)
            attempt += 1
