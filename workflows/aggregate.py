"""The aggregate workflow: one event-sourced aggregate of any registered type, `agg/{type}/{id}`.

Replaces the seed's Durable Object per entity. Commands arrive as updates (answered) or signals
(recorded even while no worker runs); each runs `decide` -> append -> `evolve` synchronously,
with no `await` in between, so commands to one aggregate serialise exactly as in the seed. The
main loop only waits: to write new events to the event store (a local activity), for the next
timer a definition asked for, or to continue-as-new when the history grows long.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from pydantic_core import to_jsonable_python

    from activities.aggregate_store import AggregateStoreActivities
    from aggregates import REGISTRY
    from aggregates.definition import (
        AggregateDefinition,
        Conflict,
        DomainError,
        Event,
        Timer,
        describe_invalid,
    )
    from contract.aggregate import (
        COMMAND_SIGNAL,
        COMMAND_UPDATE,
        DEDUPE_WINDOW,
        REJECTED_LOG,
        REJECTED_QUERY,
        STATE_QUERY,
        WORKFLOW_TYPE,
        AggregateCarry,
        AggregateErrorType,
        AggregateInput,
        AggregateView,
        CommandRequest,
        CommandResult,
        RecordedEvent,
        RejectedCommand,
        StoreEvents,
    )

# The event store must get every event, so a write is retried until the database is back.
_STORE_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)
_DETAILS_STATE_CHARS = 1500


class _Refused(Exception):
    """A command refused before or by `decide`; becomes the update's ApplicationError."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type

    def to_application_error(self) -> ApplicationError:
        return ApplicationError(str(self), type=self.error_type, non_retryable=True)


@workflow.defn(name=WORKFLOW_TYPE)
class AggregateWorkflow:
    """Hosts one aggregate: commands by update or signal, queries, timers, the event store."""

    @workflow.init
    def __init__(self, start: AggregateInput) -> None:
        self._type, self._id = start.type, start.id
        definition = REGISTRY.get(start.type)
        self._definition: AggregateDefinition[Any] | None = definition
        carry = start.carry
        if definition is None:
            self._state: Any = None
            self._views: dict[str, Any] = {}
        elif carry is None:
            self._state = definition.initial_state()
            self._views = {name: p.initial() for name, p in definition.projectors.items()}
        else:
            self._state = definition.load_state(carry.state)
            self._views = dict(carry.views)
        self._version = carry.version if carry else 0
        self._seen: dict[str, int] = dict(carry.seen_commands) if carry else {}
        self._rejected: list[RejectedCommand] = list(carry.rejected) if carry else []
        self._updated_at: datetime | None = carry.updated_at if carry else None
        self._unstored: list[RecordedEvent] = list(carry.unstored) if carry else []
        # Timers already fired at the current version: a timer whose command changed nothing
        # must not fire again in a loop.
        self._fired: set[tuple[datetime, str]] = set()
        self._fired_version = self._version

    @workflow.run
    async def run(self, start: AggregateInput) -> AggregateView:
        if self._definition is None:
            raise ApplicationError(
                f"unknown aggregate type {self._type!r}",
                type=AggregateErrorType.UNKNOWN_COMMAND,
                non_retryable=True,
            )
        self._show_details()
        while True:
            timer = self._next_timer()
            if not self._unstored and not self._continue_as_new_suggested():
                timeout = None if timer is None else max(timer.at - workflow.now(), timedelta(0))
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: bool(self._unstored) or self._continue_as_new_suggested(),
                        timeout=timeout,
                        timeout_summary=f"timer: {timer.command}" if timer else None,
                    )
            timer = self._next_timer()
            if timer is not None and timer.at <= workflow.now():
                self._fire(timer)
            if self._unstored:
                await self._store()
            if self._continue_as_new_suggested():
                # Handlers in flight finish first; what they appended goes with the carry.
                await workflow.wait_condition(workflow.all_handlers_finished)
                if self._unstored:
                    await self._store()
                workflow.continue_as_new(
                    AggregateInput(type=self._type, id=self._id, carry=self._carry())
                )

    @workflow.update(name=COMMAND_UPDATE)
    def command(self, request: CommandRequest) -> CommandResult:
        """Run one command: decide, append, evolve, with no await in between."""
        try:
            return self._apply(request)
        except _Refused as refused:
            raise refused.to_application_error() from None

    @command.validator
    def _validate_command(self, request: CommandRequest) -> None:
        # Refusing here keeps refused commands out of the history. The handler decides again:
        # another command accepted in the same task may have changed the state since.
        if request.command_id is not None and request.command_id in self._seen:
            return  # a repeat: the handler answers the first outcome
        try:
            self._check(request)
        except _Refused as refused:
            raise refused.to_application_error() from None

    @workflow.signal(name=COMMAND_SIGNAL)
    def send_command(self, request: CommandRequest) -> None:
        """The same command without an answer; a refused one goes to the rejected log."""
        if not request.command_id:
            self._reject(
                request,
                _Refused("a signalled command needs a command_id", AggregateErrorType.INVALID),
            )
            return
        try:
            self._apply(request)
        except _Refused as refused:
            self._reject(request, refused)

    @workflow.query(name=STATE_QUERY)
    def state(self) -> AggregateView:
        """State, version and the definition's per-aggregate read models."""
        return self.view()

    @workflow.query(name=REJECTED_QUERY)
    def rejected_commands(self) -> list[RejectedCommand]:
        """Signalled and timer commands that `decide` refused, newest last."""
        return list(self._rejected)

    def view(self) -> AggregateView:
        return AggregateView(
            type=self._type,
            id=self._id,
            version=self._version,
            state=self._state_json(),
            views=to_jsonable_python(self._views),
            updated_at=self._updated_at,
            rejected=len(self._rejected),
        )

    def _check(self, request: CommandRequest) -> list[Event]:
        """The events the command would cause now; raises `_Refused` if it is refused."""
        definition = self._definition
        assert definition is not None
        if request.expected_version is not None and request.expected_version != self._version:
            raise _Refused(
                f"expected version {request.expected_version}, the aggregate is at {self._version}",
                AggregateErrorType.CONFLICT,
            )
        try:
            command = definition.parse_command(request.name, request.payload)
        except KeyError:
            raise _Refused(
                f"{self._type} has no command {request.name!r}", AggregateErrorType.UNKNOWN_COMMAND
            ) from None
        except ValidationError as err:
            raise _Refused(describe_invalid(err), AggregateErrorType.INVALID) from None
        try:
            return definition.decide(self._state, command, workflow.now())
        except DomainError as err:
            kind = (
                AggregateErrorType.CONFLICT
                if isinstance(err, Conflict)
                else AggregateErrorType.INVALID
            )
            raise _Refused(f"{type(err).__name__}: {err}", kind) from None

    def _apply(self, request: CommandRequest) -> CommandResult:
        definition = self._definition
        assert definition is not None
        if request.command_id is not None and request.command_id in self._seen:
            return CommandResult(events=[], version=self._seen[request.command_id], duplicate=True)
        events = self._check(request)
        now = workflow.now()
        recorded = []
        for event in events:
            if type(event) not in definition.events:
                raise TypeError(f"{self._type}.decide returned an unregistered {event!r}")
            self._state = definition.evolve(self._state, event)
            for name, projector in definition.projectors.items():
                self._views[name] = projector.apply(self._views[name], event)
            self._version += 1
            recorded.append(
                RecordedEvent(
                    seq=self._version,
                    type=type(event).__name__,
                    data=event.model_dump(mode="json"),
                    recorded_at=now,
                    actor=request.actor,
                    command_id=request.command_id,
                )
            )
        if recorded:
            self._updated_at = now
            self._unstored.extend(recorded)
        if request.command_id is not None:
            self._seen[request.command_id] = self._version
            while len(self._seen) > DEDUPE_WINDOW:
                del self._seen[next(iter(self._seen))]
        self._show_details()
        return CommandResult(events=recorded, version=self._version)

    def _reject(self, request: CommandRequest, refused: _Refused) -> None:
        self._rejected.append(
            RejectedCommand(
                request=request,
                error_type=refused.error_type,
                message=str(refused),
                at=workflow.now(),
            )
        )
        del self._rejected[:-REJECTED_LOG]
        workflow.logger.warning("command %s refused: %s", request.name, refused)
        self._show_details()

    def _next_timer(self) -> Timer | None:
        definition = self._definition
        if definition is None:
            return None
        if self._fired_version != self._version:
            self._fired, self._fired_version = set(), self._version
        pending = [
            timer
            for timer in definition.timers(self._state)
            if (timer.at, timer.command) not in self._fired
        ]
        return min(pending, key=lambda timer: timer.at, default=None)

    def _fire(self, timer: Timer) -> None:
        self._fired.add((timer.at, timer.command))
        request = CommandRequest(
            name=timer.command,
            payload=to_jsonable_python(dict(timer.payload)),
            command_id=f"timer:{timer.command}:{timer.at.isoformat()}",
            actor="timer",
        )
        try:
            self._apply(request)
        except _Refused as refused:
            self._reject(request, refused)

    async def _store(self) -> None:
        """Write the events not yet in the event store, with the state they lead to."""
        batch = list(self._unstored)
        await workflow.execute_local_activity_method(
            AggregateStoreActivities.store_aggregate_events,
            StoreEvents(
                type=self._type,
                id=self._id,
                events=batch,
                version=self._version,
                state=self._state_json(),
                updated_at=self._updated_at or workflow.now(),
            ),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=_STORE_RETRIES,
            summary=f"store events {batch[0].seq}..{batch[-1].seq}",
        )
        # Only what was written: a command may have appended more meanwhile.
        stored = {event.seq for event in batch}
        self._unstored = [event for event in self._unstored if event.seq not in stored]

    def _continue_as_new_suggested(self) -> bool:
        return workflow.info().is_continue_as_new_suggested()

    def _carry(self) -> AggregateCarry:
        return AggregateCarry(
            state=self._state_json(),
            version=self._version,
            views=to_jsonable_python(self._views),
            seen_commands=dict(self._seen),
            rejected=list(self._rejected),
            updated_at=self._updated_at,
            unstored=list(self._unstored),
        )

    def _state_json(self) -> dict[str, Any]:
        if self._state is None:
            return {}
        state: dict[str, Any] = self._state.model_dump(mode="json")
        return state

    def _show_details(self) -> None:
        state = json.dumps(self._state_json(), sort_keys=True)
        if len(state) > _DETAILS_STATE_CHARS:
            state = state[:_DETAILS_STATE_CHARS] + "…"
        lines = [f"**{self._type} {self._id}** — version {self._version}", f"State: `{state}`"]
        if self._rejected:
            lines.append(f"Rejected commands: {len(self._rejected)} (newest last)")
            lines += [
                f"- {r.at:%H:%M:%S} `{r.request.name}` ({r.request.command_id}): {r.message}"
                for r in self._rejected[-5:]
            ]
        workflow.set_current_details("\n\n".join(lines))
