"""One ordering key's items, delivered strictly one after another inside a host workflow.

Replaces an ordered cursor over an outbox table (Postgres `FOR UPDATE SKIP LOCKED` on the
oldest row of a key; docs/explanation/ordering-lanes.md): the order items reach the host in is
its history's order, and a `Lane` runs them in that order, one at a time, with the very delivery
state machine of every other item (`workflows.delivery.Delivery`) hosted by the workflow it lives
in. Two workflows host lanes, with the same code:

- in item mode a lane has a workflow of its own (`workflows.lane`, one lane);
- in bulk mode the destination's shard that owns the key holds it (`workflows.bulk_shard`,
  many lanes beside its unordered items).

Either way no workflow is started per item: that start and finish per item is what held one lane
to ten items a second (docs/decisions/lanes-in-the-host.md). Each item's story is in the read
model, as a bulk item's is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.ids import (
        item_workflow_id,
        lane_workflow_id,
        payload_hash,
    )
    from durable_outbox_temporal.contract.item import (
        CancelRequest,
        ItemEvent,
        ItemEventType,
        ItemProjection,
        ItemStatus,
        OutboxItemInput,
        OutboxItemState,
        OutboxItemView,
    )
    from durable_outbox_temporal.contract.lane import (
        LANE_MAX_WAITING_BYTES,
        LANE_VIEW_WAITING,
        AppendOutcome,
        LaneDetail,
        LaneEntry,
        LanePolicy,
        LaneProjection,
        LaneState,
        LaneStatus,
        LaneView,
        RedriveHead,
        RemoveRequest,
        RemoveResult,
        SkipHead,
        entry_size,
        over_capacity,
    )

    from workflows.delivery import (
        Delivery,
        DeliveryFailed,
        DeliveryHost,
        NotAttempted,
        SharedActivityHost,
    )

# A busy lane's read-model row is written at least this often (and at each change of status).
PROJECT_EVERY = timedelta(seconds=1)
# New waiting items' `queued` rows ride the lane's next write (within `PROJECT_EVERY`) instead of
# forcing one in the workflow task that answers their append: that write held the answer
# (docs/decisions/lane-queued-rows-later.md). A run from before writes them at once on replay.
_QUEUED_ROWS_LATER_PATCH = "lane-queued-rows-later"
_ENTRY_BYTES_PATCH = "lane-counts-entry-bytes"


class LaneHost(DeliveryHost, SharedActivityHost, Protocol):
    """What a lane needs from the workflow that holds it, beyond hosting deliveries and sharing
    their activities (a run of its items goes in one submit activity)."""

    def lane_changed(self, lane: Lane) -> None:
        """The lane's view changed: project it soon (and show it, where the host does)."""

    def keep_listening(self, delivery: Delivery) -> None:
        """The lane's sent head leaves the lane; keep it open for its delivery reports."""

    def run_length(self, destination: str) -> int:
        """How many of the lane's items to `destination` may go in one submit activity, one
        after another (asked as each run begins)."""

    def keep_polling(self, delivery: Delivery, ended: asyncio.Task[Ended]) -> None:
        """The lane's head was accepted and the lane goes on (`order = "submit"`): see the
        item to its end (`ended`) and its report window, outside the lane."""


class Lane:
    """The items of one `(outbox, ordering_key)` inside a host, with the head's delivery."""

    def __init__(self, state: LaneState, host: LaneHost) -> None:
        self.state = state
        self.id = lane_workflow_id(state.outbox, state.ordering_key)
        self._host = host
        if state.version == 0:
            # A lane that starts (again) moves its read-model row forward from where any earlier
            # incarnation of it left it.
            state.version = int(workflow.now().timestamp() * 1_000_000)
        # Payload hashes of the keys waiting (or at the head), for each append's duplicate check.
        self._held = {entry.key: self._entry_hash(entry) for entry in state.entries}
        # The head item's delivery while it runs, and how many items at the front are out (a
        # run of items submitted in one activity, one after another).
        self.head: Delivery | None = None
        self.running: list[Delivery] = []
        self._runs = 0
        self._decision: RedriveHead | SkipHead | None = None
        # Transitions of waiting items (cancelled) the lane made itself, and the items whose
        # `queued` row it writes (with their position), to project in batches: an admit only
        # notes it, so thousands arriving in one workflow task cost little there.
        self.item_projections: list[ItemProjection] = []
        self._to_enqueue: list[tuple[LaneEntry, int]] = []
        # A carried lane's changes were projected before the hand-over.
        self.projected_version = state.version
        self._projected_status: LaneStatus | None = None
        self._projected_at = workflow.now()
        self._awaited = 0

    # -- appends ---------------------------------------------------------------------------------

    def admit(self, item: OutboxItemInput, *, capped: bool) -> AppendOutcome:
        """Add one item at the tail; a key already in the lane is a duplicate or a conflict.

        `capped`: refuse it (`full`) past `LANE_MAX_WAITING_BYTES`, for an append that can hear
        the refusal (an update); a signalled one is taken whatever the lane holds, never
        dropped."""
        state = self.state
        held = self._held.get(item.key)
        if held is not None:
            return AppendOutcome.DUPLICATE if held == item.payload_hash else AppendOutcome.CONFLICT
        size = entry_size(item.key, item.payload)
        if capped and state.entries and self._full(size):
            return AppendOutcome.FULL
        now = workflow.now()
        state.policies[item.destination] = item.policy
        entry = LaneEntry(
            key=item.key,
            destination=item.destination,
            payload=item.payload,
            enqueued_at=item.enqueued_at or now,
            max_attempts=item.policy.max_attempts,
            # A redriven item (bulk mode hands it over again) continues its events.
            generation=item.generation,
            last_event_seq=item.state.last_event_seq if item.state else 0,
            created_at=item.state.created_at if item.state else None,
            enqueue_projected=item.enqueue_projected,
        )
        state.entries.append(entry)
        self._held[item.key] = item.payload_hash
        state.waiting_bytes += size
        if not item.enqueue_projected:
            # `queued` in the read model from the lane's next write on (within `PROJECT_EVERY`).
            self._to_enqueue.append((entry, len(state.entries)))
        self._changed()
        return AppendOutcome.QUEUED

    def _full(self, size: int) -> bool:
        state = self.state
        if state.waiting_bytes + size > LANE_MAX_WAITING_BYTES:
            return True
        # Each entry's own bytes counted too; asked only when that alone refuses, so a run from
        # before, which took such appends, takes them again on replay.
        return over_capacity(state.waiting_bytes, len(state.entries), size) and workflow.patched(
            _ENTRY_BYTES_PATCH
        )

    def holds(self, key: str) -> bool:
        return key in self._held

    # -- the head --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver the items one after another until none is left; a halted lane waits here for
        its operator's redrive or skip."""
        while self.state.entries:
            entry = self.state.entries[0]
            if self.state.halted_reason is not None:
                await workflow.wait_condition(lambda: self._decision is not None)
                self._take_decision(entry)
            else:
                await self._deliver(self._next_run())

    def _next_run(self) -> list[LaneEntry]:
        """The head, and the fresh items behind it that may go in the same submit activity, one
        after another (same destination; not resumed, not redriven)."""
        entries = self.state.entries
        head = entries[0]
        run = [head]
        length = self._host.run_length(head.destination)
        if head.state is not None or head.generation:
            return run
        for entry in entries[1:length]:
            if entry.state is not None or entry.generation or entry.destination != head.destination:
                break
            run.append(entry)
        return run

    async def _deliver(self, run: list[LaneEntry]) -> None:
        """Deliver a run of items in order. Each goes on to the provider only once the one
        before it was delivered (the submit activity sees to it): the first that was not becomes
        the head on its own (retrying, polling), and the ones after it were not tried."""
        state = self.state
        self._runs += 1
        sequence = f"{self.id}#{self._runs}" if len(run) > 1 else None
        deliveries = []
        for entry in run:
            delivery = Delivery(
                item_workflow_id(state.outbox, entry.key),
                self._item_input(entry),
                self._host,
                sharing=self._host,
            )
            delivery.sequence = sequence
            deliveries.append(delivery)
        tasks = [asyncio.create_task(_ended(delivery)) for delivery in deliveries]
        self.running = list(deliveries)
        state.head_started = True
        self._changed()
        for entry, delivery, task in zip(run, deliveries, tasks, strict=True):
            self.head = delivery
            if delivery.item.policy.order == "submit":
                # The next item may go once this one is accepted: from then on the host sees
                # it to its end, outside the lane.
                await workflow.wait_condition(functools.partial(_accepted_or_ended, delivery, task))
                if not task.done():
                    self.head = None
                    self.running.remove(delivery)
                    self._host.keep_polling(delivery, task)
                    self._leave(ItemStatus.SENDING)
                    continue
            ended = await task
            self.head = None
            if isinstance(ended, NotAttempted):
                break  # and so were the rest: they run again in their turn
            self.running.remove(delivery)
            if isinstance(ended, DeliveryFailed):
                self.running = []
                # The next generation starts afresh, its events numbered after this one's.
                entry.state = None
                entry.last_event_seq = ended.view.last_event_seq
                entry.created_at = ended.view.created_at
                self._head_failed(entry, str(ended))
                return
            if ended.status is ItemStatus.SENT:
                self._host.keep_listening(delivery)
            self._leave(ended.status)
        self.running = []
        if state.head_started:
            state.head_started = False
            self._changed()

    def _head_failed(self, entry: LaneEntry, reason: str) -> None:
        state = self.state
        if state.policy is LanePolicy.SKIP:
            self._leave(ItemStatus.FAILED)
            return
        state.halted_reason = f"item {entry.key} failed: {reason}"
        state.halted_at = workflow.now()
        self._decision = None
        self._changed()

    def redrive(self, request: RedriveHead) -> bool:
        """Run the failed head item again (a new generation); only while halted on that key."""
        if not self._halted_on(request.key):
            return False
        self._decision = request
        return True

    def skip(self, request: SkipHead) -> bool:
        """Move past the failed head item, which stays failed; only while halted on that key."""
        if not self._halted_on(request.key):
            return False
        self._decision = request
        return True

    def _take_decision(self, entry: LaneEntry) -> None:
        state = self.state
        decision, self._decision = self._decision, None
        state.halted_reason = None
        state.halted_at = None
        if isinstance(decision, SkipHead):
            workflow.logger.info("lane skipped %s: %s", entry.key, decision.reason)
            self._leave(ItemStatus.FAILED)
            return
        assert isinstance(decision, RedriveHead)
        if decision.policy is not None:
            state.policies[entry.destination] = decision.policy
            entry.max_attempts = decision.policy.max_attempts
        entry.last_event_seq = max(entry.last_event_seq, decision.last_event_seq)
        entry.generation += 1
        state.head_started = False
        self._changed()

    def _halted_on(self, key: str) -> bool:
        state = self.state
        return (
            state.halted_reason is not None
            and bool(state.entries)
            and state.entries[0].key == key
            and self._decision is None
        )

    def _leave(self, outcome: ItemStatus) -> None:
        """The head item is done (sent, failed and skipped past, cancelled): next one."""
        state = self.state
        entry = state.entries.pop(0)
        self._forget(entry)
        state.head_started = bool(self.running)
        if outcome is ItemStatus.SENT:
            state.sent += 1
        elif outcome is ItemStatus.FAILED:
            state.failed += 1
        elif outcome is ItemStatus.CANCELLED:
            state.cancelled += 1
        self._changed()

    def _forget(self, entry: LaneEntry) -> None:
        self._held.pop(entry.key, None)
        self.state.waiting_bytes -= entry_size(entry.key, entry.payload)

    # -- cancel ----------------------------------------------------------------------------------

    async def remove(self, request: RemoveRequest) -> RemoveResult:
        """Cancel waiting items (one key, a destination's, or all); a head item only when named
        by key and not yet handed to the provider. Returns once the cancels are projected."""

        def matches(entry: LaneEntry) -> bool:
            if request.key is not None and entry.key != request.key:
                return False
            return request.destination is None or entry.destination == request.destination

        result = RemoveResult(views=self._remove(matches, request.reason))
        head = next((d for d in self.running if d.item.key == request.key), None)
        if request.key is not None and head is not None:
            # The head backing off is cancelled; an item behind it in the run being submitted
            # now is not (its submit is on its way): the caller hears it is not cancellable.
            if head is self.running[0] and head.state.status is ItemStatus.QUEUED:
                view = await head.cancel(CancelRequest(reason=request.reason))
            else:
                view = head.view()
            if view.status is ItemStatus.CANCELLED:
                result.views.append(view)
            else:
                result.head = view
        elif request.key is not None and self.state.halted_reason is not None:
            entries = self.state.entries
            if entries and entries[0].key == request.key:
                result.head = self._failed_head_view(entries[0])
        result.removed = [view.key for view in result.views]
        version = self.state.version
        self._awaited += 1
        self._host.lane_changed(self)
        try:
            await workflow.wait_condition(
                lambda: self.projected_version >= version and not self.items_pending()
            )
        finally:
            self._awaited -= 1
        return result

    def remove_waiting(self, key: str, reason: str) -> bool:
        """Cancel one waiting item (not the head); whether the lane held it."""
        return bool(self._remove(lambda entry: entry.key == key, reason))

    def remove_all(self, reason: str) -> None:
        """Cancel every waiting item (the host was cancelled)."""
        self._remove(lambda _: True, reason)

    def _remove(self, matches: Callable[[LaneEntry], bool], reason: str) -> list[OutboxItemView]:
        """Take matching waiting entries out, each recorded as cancelled; their views."""
        state = self.state
        start = max(len(self.running), 1 if state.head_started else 0)
        kept, removed = state.entries[:start], []
        for entry in state.entries[start:]:
            if not matches(entry):
                kept.append(entry)
                continue
            self._forget(entry)
            state.cancelled += 1
            removed.append(
                self._project_item(
                    self._item_input(entry), ItemStatus.CANCELLED, ItemEventType.CANCELLED, reason
                )
            )
        if removed:
            state.entries[:] = kept
            self._changed()
        return removed

    def _failed_head_view(self, entry: LaneEntry) -> OutboxItemView:
        item = self._item_input(entry)
        progress = OutboxItemState(
            started=True,
            status=ItemStatus.FAILED,
            created_at=entry.created_at or entry.enqueued_at,
            last_event_seq=entry.last_event_seq,
        )
        return OutboxItemView.of(item_workflow_id(item.outbox, item.key), item, progress)

    # -- views and projections -------------------------------------------------------------------

    def view(self) -> LaneView:
        """The lane as the query, the API and the read model show it."""
        state = self.state
        head = state.entries[0].key if state.entries and state.head_started else None
        return LaneView(
            id=self.id,
            outbox=state.outbox,
            ordering_key=state.ordering_key,
            status=self.status(),
            policy=state.policy,
            length=len(state.entries),
            waiting_bytes=state.waiting_bytes,
            head_key=head,
            destination=state.destination,
            halted_reason=state.halted_reason,
            halted_at=state.halted_at,
            sent=state.sent,
            failed=state.failed,
            cancelled=state.cancelled,
            updated_at=workflow.now(),
            version=state.version,
        )

    def detail(self) -> LaneDetail:
        """The view and the first keys waiting behind the head."""
        skip = 1 if self.state.head_started else 0
        entries = self.state.entries[skip : skip + LANE_VIEW_WAITING]
        return LaneDetail(view=self.view(), waiting=[entry.key for entry in entries])

    def status(self) -> LaneStatus:
        if self.state.halted_reason is not None:
            return LaneStatus.HALTED
        return LaneStatus.RUNNING if self.state.entries else LaneStatus.IDLE

    def unprojected(self) -> bool:
        return self.items_pending() or self.state.version > self.projected_version

    def items_pending(self) -> bool:
        """Whether waiting items' transitions are still to be written."""
        return bool(self.item_projections) or bool(self._to_enqueue)

    def projection_due(self) -> bool:
        """Whether the read model must have the lane's changes now: a halt or its end, waiting
        items' transitions (a cancel, a skip), someone waiting for it, or `PROJECT_EVERY`
        behind. Otherwise the lane's row, and new waiting items' `queued` rows, trail it by up
        to `PROJECT_EVERY` (the live query does not): a write per delivery would put a local
        activity in each item's critical path, a write per append in each append's answer, and
        a shard's lanes go from running to idle and back with each item of interleaved keys
        (docs/decisions/lanes-in-the-host.md, docs/decisions/lane-queued-rows-later.md)."""
        status = self.status()
        halt_changed = status is not self._projected_status and LaneStatus.HALTED in (
            status,
            self._projected_status,
        )
        return (
            bool(self.item_projections)
            or (bool(self._to_enqueue) and not workflow.patched(_QUEUED_ROWS_LATER_PATCH))
            or self._awaited > 0
            or halt_changed
            or workflow.now() - self._projected_at >= PROJECT_EVERY
        )

    def take_projection(self, limit: int) -> LaneProjection:
        """The lane's view and up to `limit` of its waiting items' transitions to write (then
        `projected`; `items_pending` says whether more are left for the next one)."""
        enqueued, self._to_enqueue = self._to_enqueue[:limit], self._to_enqueue[limit:]
        items = [self._enqueued_projection(entry, position) for entry, position in enqueued]
        room = max(0, limit - len(items))
        items += self.item_projections[:room]
        del self.item_projections[:room]
        return LaneProjection(lane=self.view(), items=items)

    def _enqueued_projection(self, entry: LaneEntry, position: int) -> ItemProjection:
        self._project_item(
            self._item_input(entry),
            ItemStatus.QUEUED,
            ItemEventType.ENQUEUED,
            f"to {entry.destination}, lane {self.state.ordering_key} position {position}",
            at=entry.enqueued_at,
        )
        return self.item_projections.pop()

    def projected(self, version: int, status: LaneStatus) -> None:
        self.projected_version = max(self.projected_version, version)
        self._projected_status = status
        self._projected_at = workflow.now()

    def carry(self) -> LaneState:
        """The state to hand to the host's next run: each delivery of the run in flight where
        it was, the head's and those behind it in the same submit (`running` holds them in the
        order of the first entries). Carrying the head's alone restarted the others as new
        items: a submit already made went again under the same idempotency key with another
        first-sent time, the provider refused it as a different request, and the lane halted
        (`tests/faults/test_lane_kill.py`, runs in item mode)."""
        for entry, delivery in zip(self.state.entries, self.running, strict=False):
            entry.state = delivery.state
        return self.state

    def details(self) -> list[str]:
        """What the Web UI's current details say about the lane."""
        state = self.state
        status = self.status()
        if status is LaneStatus.HALTED:
            line = (
                f"Halted: {state.halted_reason}. Redrive or skip `{state.entries[0].key}` to go on."
            )
        elif status is LaneStatus.IDLE:
            line = "Idle: waiting for items."
        else:
            head = state.entries[0].key
            line = f"Delivering `{head}`." if state.head_started else "Next up."
        lines = [
            f"**{status.value}** — lane `{state.ordering_key}` of outbox `{state.outbox}`"
            f" ({state.policy.value} on failure)",
            line,
            f"{len(state.entries)} in the lane; sent {state.sent}, failed {state.failed},"
            f" cancelled {state.cancelled}.",
        ]
        waiting = [entry.key for entry in state.entries[: LANE_VIEW_WAITING + 1]]
        if waiting:
            lines.append("Next: " + ", ".join(f"`{key}`" for key in waiting))
        return lines

    def _item_input(self, entry: LaneEntry) -> OutboxItemInput:
        state = self.state
        policy = state.policies[entry.destination]
        if entry.max_attempts is not None and entry.max_attempts != policy.max_attempts:
            policy = dataclasses.replace(policy, max_attempts=entry.max_attempts)
        carried = entry.state
        if carried is None and entry.generation:
            carried = OutboxItemState(
                created_at=entry.created_at or entry.enqueued_at,
                last_event_seq=entry.last_event_seq,
            )
        return OutboxItemInput(
            outbox=state.outbox,
            key=entry.key,
            destination=entry.destination,
            payload=entry.payload,
            payload_hash=self._entry_hash(entry),
            policy=policy,
            ordering_key=state.ordering_key,
            enqueued_at=entry.enqueued_at,
            state=carried,
            generation=entry.generation,
            upsert_sending=False,
            activities_project=True,
            # Its `queued` row was written by the enqueuer or by the lane on arrival.
            enqueue_projected=True,
        )

    def _entry_hash(self, entry: LaneEntry) -> str:
        # Recomputed rather than carried: 64 bytes an item adds up over thousands waiting.
        return payload_hash(entry.destination, entry.payload, self.state.ordering_key)

    def _project_item(
        self,
        item: OutboxItemInput,
        status: ItemStatus,
        event: ItemEventType,
        detail: str,
        at: datetime | None = None,
    ) -> OutboxItemView:
        """Queue one transition of a waiting item (one the lane makes, not its delivery); the
        item's view after it."""
        now = at or workflow.now()
        seq = 1 if event is ItemEventType.ENQUEUED else 2
        progress = OutboxItemState(
            started=True,
            status=status,
            created_at=item.enqueued_at or now,
            updated_at=now,
            finished_at=now if status.is_final else None,
            last_event_seq=seq,
        )
        view = OutboxItemView.of(item_workflow_id(item.outbox, item.key), item, progress)
        self.item_projections.append(
            ItemProjection(
                view=view,
                events=[ItemEvent(seq=seq, type=event, status=status, at=now, detail=detail)],
                enqueued_at=item.enqueued_at,
                payload=item.payload if seq == 1 else None,
            )
        )
        return view

    def _changed(self) -> None:
        self.state.version += 1
        self._host.lane_changed(self)


Ended = OutboxItemView | DeliveryFailed | NotAttempted


def _accepted_or_ended(delivery: Delivery, ended: asyncio.Task[Ended]) -> bool:
    return ended.done() or delivery.state.status is ItemStatus.SENDING


async def _ended(delivery: Delivery) -> Ended:
    """How a delivery of a lane ended: its view (sent or cancelled), its failure, or untried."""
    try:
        return await delivery.run(listen=False)
    except (DeliveryFailed, NotAttempted) as ended:
        return ended
