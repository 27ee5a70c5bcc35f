"""The ordering lane: the items of one `(outbox, ordering_key)`, delivered strictly in order.

Replaces an ordered cursor over an outbox table (Postgres `FOR UPDATE SKIP LOCKED` on the
oldest row of a key; docs/explanation/seeds.md): items arrive by signal-with-start, so appends
from any number of API processes are serialised by the server into one history, and that
history's order is the delivery order. The lane runs one item at a time as a child item
workflow under the item's own id, so every item keeps its own history, its own cancel and its
own status in the Web UI.

The lane carries the waiting items (keys and payloads, the policy once per destination) across
continue-as-new; the client refuses appends past `LANE_MAX_WAITING_BYTES` so that carry always
fits in one Temporal payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.converter import value_to_type
from temporalio.exceptions import (
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from activities.projection import ProjectionActivities
    from contract import search_attributes
    from contract.ids import item_workflow_id, payload_hash
    from contract.item import (
        WORKFLOW_TYPE,
        ItemEvent,
        ItemEventType,
        ItemProjection,
        ItemStatus,
        OutboxItemInput,
        OutboxItemState,
        OutboxItemView,
    )
    from contract.lane import (
        APPEND_OUTCOME_QUERY,
        APPEND_SIGNAL,
        LANE_MEMORY,
        LANE_QUERY,
        LANE_VIEW_WAITING,
        LANE_WORKFLOW_TYPE,
        REDRIVE_HEAD_SIGNAL,
        REMOVE_UPDATE,
        SKIP_HEAD_SIGNAL,
        AppendOutcome,
        LaneAppend,
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
    )

# The read model must see every lane change, so a projection is retried until the DB is back.
_PROJECTION_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)

V = TypeVar("V")


@workflow.defn(name=LANE_WORKFLOW_TYPE)
class OutboxLaneWorkflow:
    """Runs the items of one ordering key one at a time, in the order they were appended."""

    @workflow.init
    def __init__(self, state: LaneState) -> None:
        self._state = state
        # Keys waiting (or at the head), for the duplicate check of each append.
        self._waiting_keys = {entry.key for entry in state.entries}
        # Transitions of waiting items (enqueued, cancelled) the lane wrote itself.
        self._item_projections: list[ItemProjection] = []
        self._projected_version = -1
        # Appends of this run the read model has not yet recorded: append id -> the version
        # that records it. Carried appends (an earlier run's) are recorded already.
        self._unrecorded_appends: dict[str, int] = {}
        self._projecting = False
        self._decision: RedriveHead | SkipHead | None = None
        self._status_attribute: LaneStatus | None = None

    @workflow.run
    async def run(self, state: LaneState) -> LaneView:
        projector = asyncio.create_task(self._project_continuously())
        try:
            while True:
                if self._state.entries:
                    await self._run_head()
                elif not await self._wait_for_work():
                    break
                # Between items (no child of this run is in flight), so nothing is lost.
                if self._history_is_long():
                    await self._settle()
                    projector.cancel()
                    workflow.continue_as_new(self._state)
        except asyncio.CancelledError:
            # The lane itself was cancelled (Web UI, CLI): its waiting items will never run, so
            # each is recorded as cancelled rather than silently dropped.
            self._remove(lambda entry: True, "lane cancelled", keep_head=True)
            await self._settle()
            raise
        await self._settle()
        projector.cancel()
        return self.view()

    @workflow.signal(name=APPEND_SIGNAL)
    def append(self, request: LaneAppend) -> None:
        """Add one item at the tail; a key already in the lane is a duplicate or a conflict."""
        state, item = self._state, request.item
        if request.append_id in state.outcomes:
            # The client sent it again (`outbox_client.lanes`) after this run had handled it:
            # the first outcome stands (it would otherwise read as a duplicate of itself).
            return
        state.policy = request.policy
        outcome = self._admit(item)
        _remember(state.outcomes, request.append_id, outcome)
        if outcome is AppendOutcome.QUEUED:
            self._unrecorded_appends[request.append_id] = state.version
        else:
            workflow.logger.info("append of %s: %s", item.key, outcome.value)

    @workflow.signal(name=REDRIVE_HEAD_SIGNAL)
    def redrive_head(self, request: RedriveHead) -> None:
        """Run the failed head item again (a new generation); only while halted on that key."""
        if self._halted_on(request.key):
            self._decision = request

    @workflow.signal(name=SKIP_HEAD_SIGNAL)
    def skip_head(self, request: SkipHead) -> None:
        """Move past the failed head item, which stays failed; only while halted on that key."""
        if self._halted_on(request.key):
            self._decision = request

    @workflow.update(name=REMOVE_UPDATE)
    async def remove(self, request: RemoveRequest) -> RemoveResult:
        """Cancel waiting items (one key, a destination's, or all); the head is never taken.

        Returns once their `cancelled` transitions are in the read model."""

        def matches(entry: LaneEntry) -> bool:
            if request.key is not None and entry.key != request.key:
                return False
            return request.destination is None or entry.destination == request.destination

        views = self._remove(matches, request.reason, keep_head=True)
        version = self._state.version
        await workflow.wait_condition(lambda: self._projected_version >= version)
        return RemoveResult(removed=[view.key for view in views], views=views)

    @workflow.query(name=LANE_QUERY)
    def detail(self) -> LaneDetail:
        """The lane's view and the first keys waiting behind its head."""
        skip = 1 if self._state.head_started else 0
        waiting = [entry.key for entry in self._state.entries[skip : skip + LANE_VIEW_WAITING]]
        return LaneDetail(view=self.view(), waiting=waiting)

    @workflow.query(name=APPEND_OUTCOME_QUERY)
    def append_outcome(self, append_id: str) -> AppendOutcome:
        """What became of one append (`unknown` if the lane has not received it).

        `queued` only once the read model has the item: a continue-as-new carries every item
        recorded before it, but an append that reaches a run while it continues as new can be
        handled after the run's state was handed on (the SDK replays the run after the server
        refused that workflow task, and may run the main loop to its end before the signal's
        handler), and is then in no run; it answers `pending`, then `unknown` from the next run,
        and the caller sends it again."""
        outcome = self._state.outcomes.get(append_id, AppendOutcome.UNKNOWN)
        if self._unrecorded_appends.get(append_id, -1) > self._projected_version:
            return AppendOutcome.PENDING
        return outcome

    def view(self) -> LaneView:
        """The lane as the query, the API and the read model show it."""
        state = self._state
        head = state.entries[0].key if state.entries and state.head_started else None
        return LaneView(
            id=workflow.info().workflow_id,
            outbox=state.outbox,
            ordering_key=state.ordering_key,
            status=self._status(),
            policy=state.policy,
            length=len(state.entries),
            waiting_bytes=state.waiting_bytes,
            head_key=head,
            halted_reason=state.halted_reason,
            halted_at=state.halted_at,
            sent=state.sent,
            failed=state.failed,
            cancelled=state.cancelled,
            updated_at=workflow.now(),
            version=state.version,
        )

    def _status(self) -> LaneStatus:
        if self._state.halted_reason is not None:
            return LaneStatus.HALTED
        return LaneStatus.RUNNING if self._state.entries else LaneStatus.IDLE

    def _admit(self, item: OutboxItemInput) -> AppendOutcome:
        state = self._state
        if item.key in self._waiting_keys:
            entry = next(entry for entry in state.entries if entry.key == item.key)
            same = self._entry_hash(entry) == item.payload_hash
            return AppendOutcome.DUPLICATE if same else AppendOutcome.CONFLICT
        if item.key in state.recent_keys:
            same = state.recent_keys[item.key] == item.payload_hash
            return AppendOutcome.DUPLICATE if same else AppendOutcome.CONFLICT
        now = workflow.now()
        state.policies[item.destination] = item.policy
        entry = LaneEntry(
            key=item.key,
            destination=item.destination,
            payload=item.payload,
            enqueued_at=item.enqueued_at or now,
            max_attempts=item.policy.max_attempts,
        )
        state.entries.append(entry)
        self._waiting_keys.add(item.key)
        state.waiting_bytes += entry_size(item.key, item.payload)
        # The item is `queued` in the read model from now on, long before its turn comes.
        self._project_item(
            self._item_input(entry),
            ItemStatus.QUEUED,
            ItemEventType.ENQUEUED,
            f"to {item.destination}, lane {state.ordering_key} position {len(state.entries)}",
        )
        self._changed()
        return AppendOutcome.QUEUED

    async def _wait_for_work(self) -> bool:
        """Wait for an append; False once the lane has been idle for its idle time."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: bool(self._state.entries),
                timeout=timedelta(seconds=self._state.idle_s),
                timeout_summary="idle: end the lane",
            )
        if self._state.entries:
            return True
        await self._settle()
        # An append may have arrived while the last projection was written.
        return bool(self._state.entries)

    async def _run_head(self) -> None:
        state = self._state
        entry = state.entries[0]
        item = self._item_input(entry)
        state.head_started = True
        self._changed()
        try:
            child = await workflow.start_child_workflow(
                WORKFLOW_TYPE,
                item,
                id=item_workflow_id(state.outbox, entry.key),
                task_queue=workflow.info().task_queue,
                # A redriven head runs again under its own id; a first run never replaces an
                # item that exists already.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
                if entry.generation
                else WorkflowIDReusePolicy.REJECT_DUPLICATE,
                # The lane may continue-as-new or end; its items never end with it.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=search_attributes.item_start_attributes(
                    item.outbox, item.destination, ItemStatus.QUEUED.value, item.ordering_key
                ),
                memo={"payload_hash": item.payload_hash},
                static_summary=item.summary(),
                result_type=OutboxItemView,
            )
        except WorkflowAlreadyStartedError:
            # The key already has an item (before the lane remembers): it is not sent twice.
            workflow.logger.warning("lane item %s exists already; not started again", entry.key)
            self._leave(None)
            return
        try:
            view: OutboxItemView = await child
        except ChildWorkflowError as err:
            await self._head_failed(entry, err)
            return
        self._leave(view.status)

    async def _head_failed(self, entry: LaneEntry, err: ChildWorkflowError) -> None:
        state = self._state
        cause = err.cause
        reason = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
        if isinstance(cause, ApplicationError) and cause.details:
            # The item ends failed with its view attached: a redrive continues its events.
            failed = value_to_type(OutboxItemView, cause.details[0])
            entry.last_event_seq = failed.last_event_seq
            entry.created_at = failed.created_at
        if state.policy is LanePolicy.SKIP:
            self._leave(ItemStatus.FAILED)
            return
        state.halted_reason = f"item {entry.key} failed: {reason}"
        state.halted_at = workflow.now()
        self._decision = None
        self._changed()
        self._show_details(
            f"Halted: {state.halted_reason}. Redrive or skip `{entry.key}` to go on."
        )
        await workflow.wait_condition(lambda: self._decision is not None)
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

    def _leave(self, outcome: ItemStatus | None) -> None:
        """The head item is done (sent, failed and skipped past, cancelled): next one."""
        state = self._state
        entry = state.entries.pop(0)
        self._waiting_keys.discard(entry.key)
        state.waiting_bytes -= entry_size(entry.key, entry.payload)
        state.head_started = False
        _remember(state.recent_keys, entry.key, self._entry_hash(entry))
        if outcome is ItemStatus.SENT:
            state.sent += 1
        elif outcome is ItemStatus.FAILED:
            state.failed += 1
        elif outcome is ItemStatus.CANCELLED:
            state.cancelled += 1
        self._changed()

    def _remove(
        self, matches: Callable[[LaneEntry], bool], reason: str, *, keep_head: bool
    ) -> list[OutboxItemView]:
        """Take matching waiting entries out, each recorded as cancelled; their views."""
        state = self._state
        start = 1 if keep_head and state.head_started else 0
        kept, removed = state.entries[:start], []
        for entry in state.entries[start:]:
            if not matches(entry):
                kept.append(entry)
                continue
            self._waiting_keys.discard(entry.key)
            state.waiting_bytes -= entry_size(entry.key, entry.payload)
            _remember(state.recent_keys, entry.key, self._entry_hash(entry))
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

    def _item_input(self, entry: LaneEntry) -> OutboxItemInput:
        state = self._state
        policy = state.policies[entry.destination]
        if entry.max_attempts is not None and entry.max_attempts != policy.max_attempts:
            policy = dataclasses.replace(policy, max_attempts=entry.max_attempts)
        carried = None
        if entry.generation:
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
        )

    def _entry_hash(self, entry: LaneEntry) -> str:
        # Recomputed rather than carried: 64 bytes an item adds up over thousands waiting.
        return payload_hash(entry.destination, entry.payload, self._state.ordering_key)

    def _project_item(
        self, item: OutboxItemInput, status: ItemStatus, event: ItemEventType, detail: str
    ) -> OutboxItemView:
        """Queue one transition of a waiting item (one the lane makes, not its workflow); the
        item's view after it."""
        now = workflow.now()
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
        self._item_projections.append(
            ItemProjection(
                view=view,
                events=[ItemEvent(seq=seq, type=event, status=status, at=now, detail=detail)],
                enqueued_at=item.enqueued_at,
                payload=item.payload if seq == 1 else None,
            )
        )
        return view

    def _changed(self) -> None:
        self._state.version += 1
        status = self._status()
        if status is not self._status_attribute:
            self._status_attribute = status
            workflow.upsert_search_attributes([search_attributes.LANE_STATE.value_set(status)])
        if status is LaneStatus.IDLE:
            self._show_details("Idle: waiting for items.")
        elif status is LaneStatus.RUNNING:
            head = self._state.entries[0].key
            self._show_details(f"Delivering `{head}`." if self._state.head_started else "Next up.")

    async def _project_continuously(self) -> None:
        """Write lane changes to the read model as they happen, a batch per write."""
        while True:
            await workflow.wait_condition(self._unprojected)
            self._projecting = True
            items, self._item_projections = self._item_projections, []
            version = self._state.version
            await workflow.execute_local_activity_method(
                ProjectionActivities.project_lane,
                LaneProjection(lane=self.view(), items=items),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_PROJECTION_RETRIES,
                summary="project lane to read model",
            )
            self._projected_version = version
            self._projecting = False
            self._unrecorded_appends = {
                append_id: needed
                for append_id, needed in self._unrecorded_appends.items()
                if needed > version
            }

    def _unprojected(self) -> bool:
        return bool(self._item_projections) or self._state.version > self._projected_version

    async def _settle(self) -> None:
        """Wait until every handler has finished and every change is in the read model."""
        await workflow.wait_condition(
            lambda: (
                workflow.all_handlers_finished()
                and not self._unprojected()
                and not self._projecting
            )
        )

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._state.continue_after_events
        )

    def _halted_on(self, key: str) -> bool:
        state = self._state
        return (
            state.halted_reason is not None
            and bool(state.entries)
            and state.entries[0].key == key
            and self._decision is None
        )

    def _show_details(self, line: str) -> None:
        state = self._state
        lines = [
            f"**{self._status().value}** — lane `{state.ordering_key}` of outbox"
            f" `{state.outbox}` ({state.policy.value} on failure)",
            line,
            f"{len(state.entries)} in the lane; sent {state.sent}, failed {state.failed},"
            f" cancelled {state.cancelled}.",
        ]
        waiting = [entry.key for entry in state.entries[: LANE_VIEW_WAITING + 1]]
        if waiting:
            lines.append("Next: " + ", ".join(f"`{key}`" for key in waiting))
        workflow.set_current_details("\n\n".join(lines))


def _remember(memory: dict[str, V], key: str, value: V) -> None:
    """Insert into a bounded memory; the oldest entries go first (dicts keep insertion order)."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > LANE_MEMORY:
        del memory[next(iter(memory))]
