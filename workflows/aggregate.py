"""The aggregate workflow: one event-sourced aggregate of any hosted type, `agg/{type}/{id}`.

Replaces a Durable Object per entity (docs/explanation/seeds.md). Commands arrive as updates
(answered) or signals (recorded even while no worker runs); each runs `decide` -> append ->
`evolve` synchronously in the aggregate's cell (`workflows/aggregate_cell.py`), with no `await`
in between, so commands to one aggregate serialise. The main loop only waits: to write new
events to the event store (a local activity), for the next timer a definition asked for, or to
continue-as-new when the history grows long.

An aggregate with nothing pending (no timer, effect or unstored event) that no command reached for
its `passivate_after` stores what it carries on its `aggregates` row and ends; the next command
starts a new run, which loads it before any command is decided
(docs/decisions/aggregate-passivation.md).

It is also the process manager: each appended event's policy plans effects, which
go into the effect ledger in the same step as the event, keyed by idempotency key (a key
already in the ledger is ignored). The main loop runs pending effects as activities, with
retries, and marks them done or failed; an operator may retry a failed one. The ledger travels
across continue-as-new.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.aggregate_definition import (
        AggregateDefinition,
        Timer,
    )
    from durable_outbox_temporal.contract.aggregate import (
        COMMAND_SIGNAL,
        COMMAND_UPDATE,
        COMMANDS_SIGNAL,
        COMMANDS_UPDATE,
        EFFECT_ACTIVITY,
        EFFECTS_QUERY,
        MAX_COMMAND_BATCH,
        REJECTED_QUERY,
        RETRY_EFFECT_UPDATE,
        RUNS_ENDED_METRIC,
        RUNS_RESUMED_METRIC,
        STATE_QUERY,
        WORKFLOW_TYPE,
        AggregateErrorType,
        AggregateInput,
        AggregateView,
        CommandBatch,
        CommandBatchResult,
        CommandOutcome,
        CommandRequest,
        CommandResult,
        EffectExecution,
        EffectRecord,
        EffectStatus,
        PassivateAggregate,
        RecordedEvent,
        RejectedCommand,
        ResumedAggregate,
        StoreEvents,
        is_shredded,
    )
    from durable_outbox_temporal.contract.ids import (
        OPERATIONS_TASK_QUEUE,
        provider_idempotency_key,
        submit_task_queue,
    )
    from durable_outbox_temporal.contract.item import (
        SUBMIT_ACTIVITY,
        DeliveryErrorDetails,
        ItemErrorType,
        SubmitRequest,
        SubmitResult,
    )

    from activities.aggregate_store import AggregateStoreActivities
    from activities.delivery import HEARTBEAT_TIMEOUT
    from workflows.aggregate_cell import AggregateCell, Refused
    from workflows.aggregate_types import HOSTED
    from workflows.slow_local_activities import SlowLocalActivities

# The event store must get every event, so a write is retried until the database is back.
_STORE_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)
_DETAILS_STATE_CHARS = 1500
# An effect's execution: enqueueing or issuing a command is a few RPCs, retried with backoff
# for about five minutes (a Temporal or database outage) before the effect is marked failed.
_EFFECT_TIMEOUT = timedelta(seconds=15)
_EFFECT_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=9,
)
# A provider call's transient failures are retried here (the submit activity reports them, with
# the provider's Retry-After, rather than retrying itself), this many times in all.
_PROVIDER_CALL_ATTEMPTS = 6
# Effects of one aggregate running at once: an event that fans out to many stays a trickle.
_EFFECTS_IN_FLIGHT = 20
# Temporal refuses a run's 2,001st update and 10,001st signal: a run hands over well before,
# leaving room for what arrives while the hand-over is tried again.
UPDATES_PER_RUN = 1000
SIGNALS_PER_RUN = 2000
# Runs started before passivation existed replay without it: they neither load a stored carry
# nor end idle; their next run (continue-as-new) does both.
_PASSIVATION_PATCH = "aggregate-passivation"
# A task that runs while one of the run's local activities begun in an earlier task is still
# out (a slow event store) upserts the memo below from now on (`SlowLocalActivities`): a signal
# handler's `decide` reckons from `now()` there. Runs from before replay without it.
_SLOW_STORE_TASKS_PATCH = "aggregate-tasks-marked-while-store-slow"
SLOW_STORE_TASKS_MEMO = "tasks_while_store_slow"
# How soon an idle check looks again when the run was active since it was armed and has been
# idle a period by then.
_SOON = timedelta(milliseconds=100)


@workflow.defn(name=WORKFLOW_TYPE)
class AggregateWorkflow:
    """Hosts one aggregate: commands by update or signal, queries, timers, the event store."""

    @workflow.init
    def __init__(self, start: AggregateInput) -> None:
        self._type, self._id = start.type, start.id
        definition = HOSTED.get(start.type)
        self._definition: AggregateDefinition[Any] | None = definition
        # The aggregate itself: what its commands decide and leave (`workflows/aggregate_cell.py`).
        self._cell = AggregateCell(start.type, start.id, definition)
        if start.carry is not None and definition is not None:
            self._cell.take(start.carry)
        # Decided before any handler runs (they run before `run` in a run's first task).
        self._passivates = workflow.patched(_PASSIVATION_PATCH)
        self._passivate_after = start.passivate_after_s
        # A run with no carry may follow one that ended idle: `run` loads what it stored first,
        # and commands wait for it.
        self._loaded = start.carry is not None or not self._passivates
        # When the idle check was last armed: a command or effect after it keeps the run open.
        self._armed_at = self._cell.last_active
        self._idle_check_due = False
        self._executing: set[str] = set()
        # Strong references to the running executions (the loop keeps only weak ones).
        self._executions: set[asyncio.Task[None]] = set()
        self._operations_queue = start.operations_task_queue or OPERATIONS_TASK_QUEUE
        # Updates and signals this run took: Temporal limits both per run.
        self._updates = 0
        self._signals = 0
        # The run's local activities (loading, storing), marking the tasks that run while one
        # is slow (`workflows/slow_local_activities.py`).
        self._locals = SlowLocalActivities(_SLOW_STORE_TASKS_PATCH, SLOW_STORE_TASKS_MEMO)

    @workflow.run
    async def run(self, start: AggregateInput) -> AggregateView:
        if self._definition is None:
            raise ApplicationError(
                f"unknown aggregate type {self._type!r}",
                type=AggregateErrorType.UNKNOWN_COMMAND,
                non_retryable=True,
            )
        if not self._loaded:
            await self._resume()
        self._arm_idle_check()
        self._show_details()
        while True:
            timer = self._cell.next_timer()
            if not self._has_work():
                timeout = None if timer is None else max(timer.at - workflow.now(), timedelta(0))
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        self._has_work,
                        timeout=timeout,
                        timeout_summary=f"timer: {timer.command}" if timer else None,
                    )
            timer = self._cell.next_timer()
            if timer is not None and timer.at <= workflow.now():
                self._fire(timer)
            if self._idle_check_due and await self._idle_end():
                return self._cell.view()
            self._start_effects()
            if self._continue_as_new_suggested():
                await self._settle_for_hand_over()
                if self._cell.erased:
                    # It holds nothing to carry (its state was erased): it ends, and the next
                    # command's run finds it erased again.
                    return self._cell.view()
                workflow.continue_as_new(
                    AggregateInput(
                        type=self._type,
                        id=self._id,
                        carry=self._cell.carry(),
                        operations_task_queue=self._operations_queue,
                        passivate_after_s=self._next_passivate_after(),
                    )
                )
            if self._cell.unstored:
                await self._store()

    @workflow.update(name=COMMAND_UPDATE)
    async def command(self, request: CommandRequest) -> CommandResult:
        """Run one command: decide, append, evolve, with no await in between."""
        self._updates += 1
        await self._wait_loaded()
        try:
            return self._cell.apply(request)
        except Refused as refused:
            raise refused.to_application_error() from None
        finally:
            self._show_details()

    @workflow.update(name=COMMANDS_UPDATE)
    async def commands(self, batch: CommandBatch) -> CommandBatchResult:
        """Run a batch of commands in order, each exactly as `command` would, in one step:
        each sees the state the one before it left, and is answered or refused on its own."""
        self._updates += 1
        await self._wait_loaded()
        outcomes = [self._outcome(request) for request in batch.commands]
        self._show_details()
        return CommandBatchResult(outcomes=outcomes)

    @commands.validator
    def _validate_commands(self, batch: CommandBatch) -> None:
        # Each command is checked by the handler, in order: one refused command must not refuse
        # the others, and each depends on the state the ones before it leave.
        if not 0 < len(batch.commands) <= MAX_COMMAND_BATCH:
            raise ApplicationError(
                f"a batch holds 1 to {MAX_COMMAND_BATCH} commands, not {len(batch.commands)}",
                type=AggregateErrorType.INVALID,
                non_retryable=True,
            )

    @command.validator
    def _validate_command(self, request: CommandRequest) -> None:
        # Refusing here keeps refused commands out of the history. The handler decides again:
        # another command accepted in the same task may have changed the state since. Before
        # the run has loaded its state, only the handler can decide.
        if not self._loaded:
            return
        try:
            if self._cell.repeated_version(request) is not None:
                return  # a repeat: the handler answers the first outcome
            self._cell.check(request)
        except Refused as refused:
            raise refused.to_application_error() from None

    @workflow.signal(name=COMMAND_SIGNAL)
    async def send_command(self, request: CommandRequest) -> None:
        """The same command without an answer; a refused one goes to the rejected log."""
        self._signals += 1
        await self._wait_loaded()
        self._record(request)
        self._show_details()

    @workflow.signal(name=COMMANDS_SIGNAL)
    async def send_commands(self, batch: CommandBatch) -> None:
        """Signalled commands in a batch, in order, each as `send_command` would run it."""
        self._signals += 1
        await self._wait_loaded()
        for request in batch.commands:
            self._record(request)
        self._show_details()

    def _record(self, request: CommandRequest) -> None:
        """Apply a signalled command; a refused one (or one without an id) is logged."""
        if not request.command_id:
            self._cell.reject(
                request,
                Refused("a signalled command needs a command_id", AggregateErrorType.INVALID),
            )
            return
        try:
            self._cell.apply(request)
        except Refused as refused:
            self._cell.reject(request, refused)

    def _outcome(self, request: CommandRequest) -> CommandOutcome:
        try:
            return CommandOutcome(result=self._cell.apply(request))
        except Refused as refused:
            return CommandOutcome(
                error_type=refused.error_type, message=str(refused), reason=refused.reason
            )

    @workflow.update(name=RETRY_EFFECT_UPDATE)
    async def retry_effect(self, key: str) -> EffectRecord:
        """Run a failed effect again (an operator's call): pending now, executed anew."""
        self._updates += 1
        await self._wait_loaded()
        self._cell.touch()
        self._check_retry_effect(key)
        record = self._cell.effects[key]
        record.status, record.error, record.finished_at = EffectStatus.PENDING, None, None
        self._show_details()
        return record

    @retry_effect.validator
    def _validate_retry_effect(self, key: str) -> None:
        if self._loaded:
            self._check_retry_effect(key)

    def _check_retry_effect(self, key: str) -> None:
        record = self._cell.effects.get(key)
        if record is None:
            raise ApplicationError(
                f"no effect {key!r} in the ledger",
                type=AggregateErrorType.UNKNOWN_EFFECT,
                non_retryable=True,
            )
        if record.status != EffectStatus.FAILED:
            raise ApplicationError(
                f"effect {key!r} is {record.status}: only a failed effect can be retried",
                type=AggregateErrorType.CONFLICT,
                non_retryable=True,
            )

    @workflow.query(name=EFFECTS_QUERY)
    def effects(self) -> list[EffectRecord]:
        """The effect ledger, oldest first: pending, done (the newest) and failed effects."""
        return list(self._cell.effects.values())

    @workflow.query(name=STATE_QUERY)
    def state(self) -> AggregateView:
        """State, version and the definition's per-aggregate read models."""
        return self._cell.view()

    @workflow.query(name=REJECTED_QUERY)
    def rejected_commands(self) -> list[RejectedCommand]:
        """Signalled and timer commands that `decide` refused, newest last."""
        return list(self._cell.rejected)

    def _fire(self, timer: Timer) -> None:
        self._cell.fire(timer)
        self._show_details()

    async def _store(self) -> None:
        """Write the events not yet in the event store, with the state they lead to."""
        batch = list(self._cell.unstored)
        await self._locals.run(
            workflow.execute_local_activity_method(
                AggregateStoreActivities.store_aggregate_events,
                StoreEvents(
                    type=self._type,
                    id=self._id,
                    events=batch,
                    version=self._cell.version,
                    state=self._cell.state_json(),
                    updated_at=self._cell.updated_at or workflow.now(),
                ),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_STORE_RETRIES,
                summary=f"store events {batch[0].seq}..{batch[-1].seq}",
            )
        )
        # Only what was written: a command may have appended more meanwhile.
        stored = {event.seq for event in batch}
        self._cell.unstored = [event for event in self._cell.unstored if event.seq not in stored]

    async def _settle_for_hand_over(self) -> None:
        """Handlers and effects in flight finish first (no new effect starts meanwhile); the
        events not yet stored go with the carry, and the next run writes them. Nothing is
        awaited between the handlers' end and the hand-over, so no command comes in between,
        and the task that hands over is short: commands arriving while it runs make the server
        refuse it, so a steady stream would otherwise hold the hand-over off."""
        await workflow.wait_condition(
            lambda: workflow.all_handlers_finished() and not self._executing
        )

    def _continue_as_new_suggested(self) -> bool:
        return (
            workflow.info().is_continue_as_new_suggested()
            or self._updates >= UPDATES_PER_RUN
            or self._signals >= SIGNALS_PER_RUN
        )

    def _has_work(self) -> bool:
        return (
            self._idle_check_due
            or bool(self._cell.unstored)
            or self._continue_as_new_suggested()
            or bool(self._startable_effects())
        )

    # The executor: pending effects run as activities, a bounded number at once.

    def _startable_effects(self) -> list[EffectRecord]:
        if self._continue_as_new_suggested():
            return []  # they start in the next run
        room = _EFFECTS_IN_FLIGHT - len(self._executing)
        pending = [
            record
            for record in self._cell.effects.values()
            if record.status == EffectStatus.PENDING and record.key not in self._executing
        ]
        return pending[: max(room, 0)]

    def _start_effects(self) -> None:
        for record in self._startable_effects():
            self._executing.add(record.key)
            task = asyncio.create_task(self._execute(record))
            self._executions.add(task)
            task.add_done_callback(self._executions.discard)

    async def _execute(self, record: EffectRecord) -> None:
        record.executions += 1
        try:
            if record.kind == "call_provider":
                record.result = await self._call_provider(record)
            else:
                record.result = await workflow.execute_activity(
                    EFFECT_ACTIVITY,
                    EffectExecution(
                        aggregate_type=self._type,
                        aggregate_id=self._id,
                        key=record.key,
                        kind=record.kind,
                        action=record.action,
                    ),
                    task_queue=self._operations_queue,
                    start_to_close_timeout=_EFFECT_TIMEOUT,
                    retry_policy=_EFFECT_RETRIES,
                    result_type=dict[str, Any],
                    summary=f"{record.kind} {record.name} (event {record.event_seq})",
                )
            record.status, record.error = EffectStatus.DONE, None
        except ActivityError as err:
            record.status, record.error = EffectStatus.FAILED, _describe(err)
            workflow.logger.warning("effect %s failed: %s", record.key, record.error)
        finally:
            record.finished_at = workflow.now()
            self._cell.touch()
            self._executing.discard(record.key)
            self._cell.forget_old_done_effects()
            self._show_details()

    async def _call_provider(self, record: EffectRecord) -> dict[str, Any]:
        """Submit on the destination's own queue (its rate and pause hold), honouring the
        provider's Retry-After between attempts; the key is the provider's idempotency key."""
        destination = str(record.action["destination"])
        for attempt in range(1, _PROVIDER_CALL_ATTEMPTS + 1):
            try:
                result: SubmitResult = await workflow.execute_activity(
                    SUBMIT_ACTIVITY,
                    SubmitRequest(
                        destination=destination,
                        item_id=f"effect/{record.key}",
                        idempotency_key=provider_idempotency_key(f"effect/{record.key}"),
                        payload=dict(record.action["payload"]),
                        attempt=attempt,
                        # Durable and the same on every attempt: the provider's dedupe window
                        # is reckoned from it (`SubmitRequest.first_submitted_at`).
                        first_submitted_at=record.created_at,
                    ),
                    task_queue=submit_task_queue(destination),
                    start_to_close_timeout=_EFFECT_TIMEOUT,
                    # A start that reached no worker is tried again after this, as an item's
                    # submit is (`activities.delivery._to_the_end`), not after the 15 s.
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=_EFFECT_RETRIES,
                    result_type=SubmitResult,
                    summary=f"call {destination} for {record.name} (attempt {attempt})",
                )
            except ActivityError as err:
                cause = err.cause
                transient = (
                    isinstance(cause, ApplicationError) and cause.type == ItemErrorType.TRANSIENT
                )
                if not transient or attempt == _PROVIDER_CALL_ATTEMPTS:
                    raise
                assert isinstance(cause, ApplicationError)
                details = cause.details[0] if cause.details else None
                retry_after = DeliveryErrorDetails(**details).retry_after_s if details else None
                backoff = min(2.0 ** (attempt - 1), 60.0)
                await workflow.sleep(
                    max(backoff, retry_after or 0.0), summary=f"retry {record.name}"
                )
                continue
            return {
                "delivered": result.delivered,
                "operation_url": result.operation_url,
                "provider_message_id": result.provider_message_id,
            }
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _wait_loaded(self) -> None:
        if not self._loaded:
            await workflow.wait_condition(lambda: self._loaded)

    async def _resume(self) -> None:
        """Load what the aggregate's last run stored (nothing for a new aggregate)."""
        definition = self._definition
        assert definition is not None
        resumed: ResumedAggregate | None = await self._locals.run(
            workflow.execute_local_activity_method(
                AggregateStoreActivities.resume_aggregate,
                args=[self._type, self._id],
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_STORE_RETRIES,
                summary="load the stored aggregate",
            )
        )
        if resumed is not None:
            source = "carry" if resumed.carry else "erased" if resumed.erased else "state"
            self._count(RUNS_RESUMED_METRIC, source=source)
        if resumed is not None and resumed.carry is not None:
            self._cell.take(resumed.carry)
        elif resumed is not None:
            # A run that ended without storing its carry (terminated): the stored state and
            # version hold, the views are folded again from the stored events; the dedupe
            # window, rejected log and effect ledger are gone.
            self._cell.version, self._cell.updated_at = resumed.version, resumed.updated_at
            self._cell.erased = resumed.erased
            if not resumed.erased:
                self._cell.state = definition.load_state(resumed.state)
                await self._refold_views()
                workflow.logger.warning(
                    "%s %s resumed from its stored state at version %d, without a carry",
                    self._type,
                    self._id,
                    self._cell.version,
                )
        self._loaded = True

    async def _refold_views(self) -> None:
        """The definition's views folded from the stored events, a page at a time (erased
        events are passed over, as the async projectors do)."""
        definition = self._definition
        assert definition is not None
        if not definition.projectors:
            return
        after = 0
        while after < self._cell.version:
            page: list[RecordedEvent] = await self._locals.run(
                workflow.execute_local_activity_method(
                    AggregateStoreActivities.read_aggregate_events,
                    args=[self._type, self._id, after],
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=_STORE_RETRIES,
                    summary=f"fold the views from event {after + 1}",
                )
            )
            for recorded in page:
                if is_shredded(recorded.data):
                    continue
                event = definition.parse_event(recorded.type, recorded.data)
                for name, projector in definition.projectors.items():
                    self._cell.views[name] = projector.apply(self._cell.views[name], event)
            if not page:
                break
            after = page[-1].seq

    def _count(self, metric: tuple[str, str], **attributes: str) -> None:
        name, description = metric
        counter = workflow.metric_meter().create_counter(name, description)
        counter.add(1, {"aggregate_type": self._type, **attributes})

    def _arm_idle_check(
        self, at: datetime | None = None, *, least: timedelta = timedelta(seconds=1)
    ) -> None:
        """A timer that rings at `at` (by default when the run will have been idle long enough)
        to see whether it may end: one per idle period at most, however many commands come (a
        timer per wait would add two events to each command's task)."""
        after = self._passivate_after
        if not self._passivates or not after or after <= 0:
            return
        at = at or self._cell.last_active + timedelta(seconds=after)
        # Never a timer that rings at once: a check that keeps failing would spin.
        due = max(at - workflow.now(), least)
        self._armed_at = workflow.now()
        self._idle_check_due = False

        async def ring() -> None:
            await workflow.sleep(due, summary="end if idle")
            self._idle_check_due = True

        task = asyncio.create_task(ring())
        self._executions.add(task)
        task.add_done_callback(self._executions.discard)

    def _idle(self) -> bool:
        """Nothing pending that the run must be open for: no unstored event, timer, effect
        (failed ones wait for an operator's retry), handler, or hand-over."""
        return (
            not self._cell.unstored
            and self._cell.next_timer() is None
            and not self._executing
            and all(r.status == EffectStatus.DONE for r in self._cell.effects.values())
            and workflow.all_handlers_finished()
            and not self._continue_as_new_suggested()
        )

    async def _idle_end(self) -> bool:
        """Whether the run ends now: idle since long enough, its carry stored. Otherwise the
        check is armed again."""
        after = timedelta(seconds=self._passivate_after or 0)
        # Active since the check was armed: look again a period after the last command or
        # effect. Decided by the order of events, never by `now() - _last_active`: a task that
        # completed with no command (an effect's completion, say) is replayed merged into the
        # next task, under that task's later time, so a measured idle time can be a period on
        # the run and less on its replay (the next task then found the run not yet idle, a
        # nondeterminism error, where the run had stored itself and ended). The SDK core's
        # merge: temporalio/sdk-rust#1606. Why: docs/decisions/aggregate-passivation.md
        # If that is past already (a late ring: a period of 0.5 s rings after 1 s at the
        # earliest), soon: such a check cannot spin, each needs a command since the one before.
        if self._cell.last_active > self._armed_at:
            self._arm_idle_check(least=_SOON)
            return False
        if not self._idle():
            # Something pending (a timer, an effect, a failed effect waiting for an operator):
            # look again a whole period later.
            self._arm_idle_check(workflow.now() + after)
            return False
        before = self._activity_mark()
        if not self._cell.erased and self._cell.version > 0:
            stored = await self._locals.run(
                workflow.execute_local_activity_method(
                    AggregateStoreActivities.passivate_aggregate,
                    PassivateAggregate(
                        type=self._type,
                        id=self._id,
                        carry=self._cell.carry(),
                        passivated_at=workflow.now(),
                    ),
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=_STORE_RETRIES,
                    summary="store the idle aggregate",
                )
            )
            if not stored:
                workflow.logger.warning(
                    "%s %s not ended: the store is not at its version", self._type, self._id
                )
        else:
            stored = True
        # A command that came while the carry was stored keeps the run going; its own idle
        # end stores again. Nothing is awaited from here to the end of the run.
        if stored and self._activity_mark() == before and self._idle():
            self._count(RUNS_ENDED_METRIC)
            return True
        self._arm_idle_check(max(self._cell.last_active, workflow.now()) + after)
        return False

    def _activity_mark(self) -> tuple[int, int, int, datetime]:
        return (self._cell.version, self._updates, self._signals, self._cell.last_active)

    def _next_passivate_after(self) -> float | None:
        if self._passivate_after is not None:
            return self._passivate_after
        definition = self._definition
        assert definition is not None
        return definition.passivate_after_s()

    def _show_details(self) -> None:
        state = json.dumps(self._cell.state_json(), sort_keys=True)
        if len(state) > _DETAILS_STATE_CHARS:
            state = state[:_DETAILS_STATE_CHARS] + "…"
        lines = [f"**{self._type} {self._id}** — version {self._cell.version}", f"State: `{state}`"]
        if self._cell.rejected:
            lines.append(f"Rejected commands: {len(self._cell.rejected)} (newest last)")
            lines += [
                f"- {r.at:%H:%M:%S} `{r.request.name}` ({r.request.command_id}): {r.message}"
                for r in self._cell.rejected[-5:]
            ]
        lines += self._effect_lines()
        workflow.set_current_details("\n\n".join(lines))

    def _effect_lines(self) -> list[str]:
        if not self._cell.effects:
            return []
        counts = self._cell.effect_counts()
        lines = ["Effects: " + ", ".join(f"{n} {status}" for status, n in counts.items())]
        unsettled = [r for r in self._cell.effects.values() if r.status != EffectStatus.DONE]
        lines += [
            f"- {r.status} `{r.key}` ({r.kind}, {r.executions} executions)"
            + (f": {r.error}" if r.error else "")
            for r in unsettled[:10]
        ]
        return lines


def _describe(err: ActivityError) -> str:
    """Why the activity failed, as an operator reads it: the error it raised, by type."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'ApplicationError'}: {cause.message}"[:1000]
    return f"{type(cause).__name__}: {cause}"[:1000]
