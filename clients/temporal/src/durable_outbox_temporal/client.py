"""`OutboxClient`: enqueue, inspect, cancel and redrive items directly through Temporal.

The REST API is a thin layer over this class, and other Python services may use it instead of
REST. Where an item lives depends on its destination's mode and its ordering key: the client
chooses that item's placement once (`durable_outbox_temporal.placement`), and every verb goes to it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client

from durable_outbox_temporal import lanes
from durable_outbox_temporal.connection import TemporalConnection, check_stack_keys
from durable_outbox_temporal.contract import debounce_rules, http_call, limits, provider_payloads
from durable_outbox_temporal.contract.debounce import DebounceWindowView
from durable_outbox_temporal.contract.ids import (
    WORKFLOW_TASK_QUEUE,
    item_workflow_id,
    parse_item_workflow_id,
    payload_hash,
)
from durable_outbox_temporal.contract.item import (
    DeliveryReport,
    ItemStatus,
    NewItem,
    OutboxItemInput,
    OutboxItemView,
)
from durable_outbox_temporal.contract.lane import LaneDetail
from durable_outbox_temporal.debounce import Debouncer
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.errors import (
    CannotCancel,
    InvalidRequest,
    ItemNotFound,
    PayloadTooLarge,
    UnknownDestination,
    check_same_request,
    failed_use_redrive,
)
from durable_outbox_temporal.item_lanes import ItemLanes
from durable_outbox_temporal.own_workflow import OwnWorkflows
from durable_outbox_temporal.placement import (
    RPC_TIMEOUT,
    CancelRequested,
    EnqueueResult,
    HostedItems,
    ItemRef,
    Placement,
    Redrive,
)
from durable_outbox_temporal.shards import Routes, Shards
from durable_outbox_temporal.validation import (
    validate_key,
    validate_new_item,
    validate_ordering_key,
    validate_outbox,
)

__all__ = [
    "CANCEL_WAIT",
    "RPC_TIMEOUT",
    "CancelRequested",
    "EnqueueResult",
    "OutboxClient",
    "check_same_request",
    "failed_use_redrive",
]

log = logging.getLogger("outbox.client")
# Writes a just-started item's `queued` row: (item id, its input).
RecordQueued = Callable[[str, OutboxItemInput], Awaitable[None]]
# How long a cancel waits for a worker to answer before it falls back to a signal.
CANCEL_WAIT = timedelta(seconds=5)


class OutboxClient:
    """Typed access to outbox items for any Python service; no REST involved.

    Args:
        client: a connected Temporal client (see `durable_outbox_temporal.connect`), or a
            `TemporalConnection` that connects on first use.
        destinations: the configured destinations; an item snapshots its destination's
            delivery policy when it is enqueued.
        task_queue: the task queue the workflow worker polls (`WORKFLOW_TASK_QUEUE`).
        routes: where bulk-mode owners (ordering lanes, unordered items) are routed, shared
            with every other process that hands items over (`readmodel.routes.ReadModelRoutes`:
            the API, the relay and the worker pass theirs). Without it, bulk items go by the
            configured `shards`, which must then not change while this client runs
            (docs/how-to/bulk-mode.md).
    """

    def __init__(
        self,
        client: Client | TemporalConnection,
        destinations: DestinationRegistry,
        task_queue: str = WORKFLOW_TASK_QUEUE,
        routes: Routes | None = None,
    ) -> None:
        self._client = client
        self.task_queue = task_queue
        # Whether this client's payload keys were checked against the stack's (`temporal`).
        self._keys_checked = False
        self._own = OwnWorkflows(self.temporal, destinations, task_queue)
        self._lanes = ItemLanes(self.temporal, destinations, task_queue)
        self._shards = Shards(self.temporal, destinations, task_queue, routes=routes)
        self._debouncer = Debouncer(self.temporal, task_queue)
        self._destinations = destinations

    @property
    def destinations(self) -> DestinationRegistry:
        """The configured destinations (and outboxes' settings) every placement reads."""
        return self._destinations

    @destinations.setter
    def destinations(self, registry: DestinationRegistry) -> None:
        self._destinations = registry
        for place in (self._own, self._lanes, self._shards):
            place.destinations = registry

    @property
    def connection(self) -> Client | TemporalConnection:
        """What this client reaches Temporal through, to share with an `AggregateClient`."""
        return self._client

    async def temporal(self) -> Client:
        """The Temporal client; raises `TemporalUnavailable` while it cannot connect, and
        `PayloadKeyMissing` when the stack encrypts under a key this client does not have."""
        client = self._client if isinstance(self._client, Client) else await self._client.client()
        if not self._keys_checked:
            await check_stack_keys(client, self.task_queue)
            self._keys_checked = True
        return client

    def placement(self, destination: str | None, ordering_key: str | None) -> Placement:
        """Where an item of `destination` (None or unknown: item mode) with `ordering_key` lives."""
        if self.destinations.bulk(destination) is not None:
            return self._shards
        if ordering_key is not None:
            return self._lanes
        return self._own

    def _hosted(self, destination: str | None) -> HostedItems:
        """Where a lane lives: in `destination`'s shards if it is in bulk mode, else its own."""
        return self._shards if self.destinations.bulk(destination) is not None else self._lanes

    async def enqueue(
        self,
        outbox: str,
        destination: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        ordering_key: str | None = None,
        not_before: datetime | None = None,
        max_attempts: int | None = None,
        record_queued: RecordQueued | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        debounce_key: str | None = None,
        debounce_s: float | None = None,
        debounce_mode: str | None = None,
        max_wait_s: float | None = None,
    ) -> EnqueueResult:
        """Hand the item to where it lives, or return the existing item for a repeated key.

        Args:
            outbox: the outbox (a namespace of keys), e.g. `billing`.
            destination: a configured destination name.
            payload: what the provider receives (ACS email body, webhook JSON).
            key: the idempotency key; a fresh UUID when None. Repeating it returns the
                existing item, or raises `IdempotencyConflict` if the request differs.
            ordering_key: deliver strictly after the outbox's earlier items with this key: the
                item is appended to its ordering lane, which runs it when its turn comes.
                Raises `LaneFull` when the lane carries as much as it can.
            not_before: deliver no earlier than this (time-zone aware).
            max_attempts: lower the destination's attempt limit for this item.
            priority: 1 (first) to 5 (last) under a backlog; None: 3.
            concurrency_key: whose share of the destination's caps and quotas the item counts
                in (a tenant, a customer); see `flowcontrol/caps.py`.
            debounce_key: coalesce with the destination's items of this key: they wait in the
                key's window, which closes `debounce_s` after its last item (at most
                `max_wait_s` after its first) and delivers one item for them all, the others
                ending `superseded` (`durable_outbox_temporal/contract/debounce_rules.py`).
                `debounce_mode` `latest` (default) delivers the last payload, `collect` (webhooks) a
                JSON array of all.
            record_queued: for a caller with the read model: writes the new item's `queued`
                row (`durable_outbox_temporal.contract.transitions.enqueued`) right after the
                hand-over, which spares the item a local activity.
        """
        request = NewItem(
            destination,
            payload,
            key if key is not None else str(uuid.uuid4()),
            ordering_key=ordering_key,
            not_before=not_before,
            max_attempts=max_attempts,
            priority=priority,
            concurrency_key=concurrency_key,
            debounce_key=debounce_key,
            debounce_s=debounce_s,
            debounce_mode=debounce_mode,
            max_wait_s=max_wait_s,
        )
        item = self.new_item(outbox, request, projected=record_queued is not None)
        [result] = await self.hand_over([item])
        if isinstance(result, Exception):
            raise result
        if result.created and record_queued is not None:
            try:
                await record_queued(result.item_id, item)
            except Exception as err:
                # The item is handed over and its first submit writes the row: only the
                # moments before it (or a paused destination's wait) lack it in the read model.
                log.warning("queued row of %s left to its first submit: %s", result.item_id, err)
        return result

    async def hand_over(
        self, items: Sequence[OutboxItemInput], *, strict: bool = False
    ) -> list[EnqueueResult | Exception]:
        """Hand built items (`new_item`) to where each lives, each placement's in the given
        order (a lane gets its items in that order); each item's result or error, in order
        (`strict`: the first error is raised instead, once every item was tried).

        In bulk mode a shard ignores an item it holds or finished lately, and the result says
        created: repeats of older items are a read model's to answer (`ItemService` asks it
        first)."""
        groups: dict[int, tuple[Placement | Debouncer, list[int]]] = {}
        for index, item in enumerate(items):
            place: Placement | Debouncer = (
                self._debouncer
                if item.debounce is not None
                else self.placement(item.destination, item.ordering_key)
            )
            groups.setdefault(id(place), (place, []))[1].append(index)
        handed = await asyncio.gather(
            *(place.hand_over([items[i] for i in indexes]) for place, indexes in groups.values())
        )
        outcome_of: dict[int, bool | Exception] = {}
        for (_, indexes), outcomes in zip(groups.values(), handed, strict=True):
            outcome_of.update(zip(indexes, outcomes, strict=True))
        results = [_result(item, outcome_of[index]) for index, item in enumerate(items)]
        failed = [result for result in results if isinstance(result, Exception)]
        if strict and failed:
            raise failed[0]
        return results

    def new_item(self, outbox: str, item: NewItem, *, projected: bool = False) -> OutboxItemInput:
        """The workflow input of `item` in `outbox`, validated (the rules are `enqueue`'s);
        starts nothing.

        `projected`: the caller writes the item's `queued` row itself once it is handed over."""
        now = datetime.now(UTC)
        validate_new_item(
            outbox,
            item.key,
            ordering_key=item.ordering_key,
            not_before=item.not_before,
            max_attempts=item.max_attempts,
            now=now,
            priority=item.priority,
            payload=item.payload,
        )
        if item.concurrency_key is not None:
            try:
                limits.check_concurrency_key(item.concurrency_key)
            except ValueError as err:
                raise InvalidRequest(str(err)) from None
        if item.subject is not None and not projected:
            # Kept nowhere else: a subject this client accepted would be silently dropped.
            raise InvalidRequest(
                "subject: only an enqueuer with the read model keeps it (the REST API,"
                " `service.items.ItemService`); this client has nowhere to record it"
            )
        target = self._destination(item.destination)
        try:
            debounced = debounce_rules.debounce_spec(
                item.debounce_key,
                item.debounce_s,
                mode=item.debounce_mode,
                max_wait_s=item.max_wait_s,
                provider=target.provider,
                ordering_key=item.ordering_key,
                not_before=item.not_before,
            )
            debounce_rules.check_payload(item.payload)
            provider_payloads.check_payload_for(target.provider, target.settings, item.payload)
        except http_call.BodyTooLarge as err:
            raise PayloadTooLarge(str(err)) from None
        except ValueError as err:
            raise InvalidRequest(str(err)) from None
        return OutboxItemInput(
            outbox=outbox,
            key=item.key,
            destination=item.destination,
            payload=item.payload,
            payload_hash=payload_hash(item.destination, item.payload, item.ordering_key),
            policy=target.policy(item.max_attempts),
            ordering_key=item.ordering_key,
            enqueued_at=now,
            not_before=item.not_before,
            upsert_sending=False,
            activities_project=True,
            enqueue_projected=projected,
            priority=item.priority,
            concurrency_key=item.concurrency_key,
            debounce=debounced,
            # An unordered bulk item is routed by this count from now on (a laned one goes by
            # its lane's shard).
            shards=target.shards if target.is_bulk and item.ordering_key is None else None,
        )

    def _destination(self, name: str) -> Destination:
        target = self.destinations.get(name)
        if target is None:
            known = ", ".join(self.destinations.names) or "none"
            raise UnknownDestination(f"unknown destination {name!r} (configured: {known})")
        return target

    async def status(self, outbox: str, key: str) -> OutboxItemView:
        """The live view of an item that is a workflow of its own (item mode, no ordering key),
        or its final view once it has ended; `ItemNotFound` for any other (a read model has
        those)."""
        return await self._own.status(outbox, key)

    async def cancel(
        self,
        outbox: str,
        key: str,
        reason: str = "cancelled by request",
        *,
        wait: timedelta = CANCEL_WAIT,
        ordering_key: str | None = None,
        known: OutboxItemView | None = None,
    ) -> OutboxItemView | CancelRequested:
        """Cancel a queued item. Raises `CannotCancel` once it has been handed to the provider.

        Where the item lives says how: its own workflow answers an update (with no worker
        within `wait`, a `request_cancel` signal is recorded instead and the answer is
        `CancelRequested`); a lane takes a waiting item out; a shard acts on a signal
        (`CancelRequested`). Say where it lives with `known` (the item's last view, from a
        read model) or, for an item-mode lane's item, its `ordering_key`.
        """
        validate_outbox(outbox)
        validate_key(key)
        item = ItemRef.of(known) if known is not None else ItemRef(outbox, key, None, ordering_key)
        place = self.placement(item.destination, item.ordering_key)
        if known is not None and known.debounce_key and known.status is ItemStatus.QUEUED:
            left = await self._debouncer.leave(known, reason)
            if left is not None:
                return left
            # Its window closed meanwhile: it is the carrier, an item of its own now, or one
            # the carrier took along (no item of its own to cancel).
            try:
                return await place.cancel(item, reason, wait)
            except ItemNotFound:
                raise CannotCancel(
                    "its debounce window closed meanwhile: the item that carried it is being"
                    " delivered"
                ) from None
        return await place.cancel(item, reason, wait)

    async def debounce_window(self, view: OutboxItemView) -> DebounceWindowView | None:
        """The open debounce window of the item's key (None: it has none)."""
        return await self._debouncer.window(view)

    async def queued_keys(self, outbox: str, destination: str | None = None) -> list[str]:
        """Keys of the outbox's queued items that are workflows of their own (visibility)."""
        return await self._own.queued_keys(outbox, destination)

    async def purge_lanes(
        self, outbox: str, destination: str | None = None, reason: str = "purged"
    ) -> list[str]:
        """Take every item waiting in the outbox's item-mode lanes out (optionally of one
        destination); the keys taken. Items running at a lane's head are the item purge's to
        cancel."""
        validate_outbox(outbox)
        return await self._lanes.purge(outbox, destination, reason, CANCEL_WAIT)

    async def lane(
        self, outbox: str, ordering_key: str, destination: str | None = None
    ) -> LaneDetail | None:
        """A running lane's live view and its first waiting keys; None if it is not running.

        `destination`: the lane's destination; a bulk-mode one's shard holds the lane (None, or
        one in item mode: the lane's own workflow)."""
        validate_outbox(outbox)
        validate_ordering_key(ordering_key)
        holder = await self._hosted(destination).lane_holder(outbox, ordering_key, destination)
        return await lanes.detail(await self.temporal(), holder, outbox, ordering_key)

    async def resume_lane(
        self,
        outbox: str,
        ordering_key: str,
        *,
        skip_reason: str | None = None,
        last_event_seq: int = 0,
        head_destination: str | None = None,
        destination: str | None = None,
    ) -> str:
        """Resume a halted lane by redriving its failed head item (with `head_destination`'s
        current policy, when given), or by skipping it when `skip_reason` is given; the head's
        key. `destination`: as for `lane`.

        `last_event_seq`: as for `redrive`, the newest event the caller's read model holds."""
        return await self._hosted(destination).resume(
            outbox,
            ordering_key,
            destination,
            head_destination=head_destination,
            last_event_seq=last_event_seq,
            skip_reason=skip_reason,
        )

    async def report_delivery(
        self,
        item_id: str,
        report: DeliveryReport,
        destination: str | None = None,
        *,
        ordering_key: str | None = None,
        shards: int | None = None,
    ) -> bool:
        """Signal the provider's report on one recipient to the workflow holding the item.

        False when that workflow has ended (the item's report window is over) or does not
        exist; the signal needs no worker, so a report is never lost to a worker outage.
        `shards`: in bulk mode, the count the item was routed by, where known (its row's).
        """
        outbox, key = parse_item_workflow_id(item_id)
        item = ItemRef(outbox, key, destination, ordering_key, shards=shards)
        return await self.placement(destination, ordering_key).report(item, report)

    async def redrive(
        self,
        outbox: str,
        key: str,
        *,
        last_event_seq: int = 0,
        known: OutboxItemView | None = None,
        payload: dict[str, Any] | None = None,
        generation: int = 0,
    ) -> EnqueueResult:
        """Run a permanently failed item again under the same id, with fresh attempts and the
        destination's current policy.

        Args:
            last_event_seq: the newest event seq the caller's read model holds for the item. A
                run that ended through our own code reports its own; a terminated or timed-out
                run cannot, and the new run must continue the sequence (the read model ignores
                events it already has), so the service layer passes the read model's.
            known: the item's last view (from a read model), which says where it lives; None:
                it is a workflow of its own. An item with no workflow of its own (bulk mode, or
                an item-mode lane's item) also needs:
            payload: its payload, and
            generation: its new generation (each has its own provider key).
        """
        validate_outbox(outbox)
        validate_key(key)
        item = ItemRef.of(known) if known is not None else ItemRef(outbox, key)
        again = Redrive(payload or {}, generation, last_event_seq)
        return await self.placement(item.destination, item.ordering_key).redrive(item, again)


def _result(item: OutboxItemInput, outcome: bool | Exception) -> EnqueueResult | Exception:
    """A hand-over's outcome for one item: its error, or whether it was created."""
    if isinstance(outcome, Exception):
        return outcome
    item_id = item_workflow_id(item.outbox, item.key)
    return EnqueueResult(item_id=item_id, outbox=item.outbox, key=item.key, created=outcome)
