"""`AggregateClient`: commands, state and history of event-sourced aggregates, through Temporal.

    aggregates = AggregateClient(await connect(), definitions=[FlightSeating()])
    result = await aggregates.command("flight", "BA117", "assign_seat",
                                      {"seat": "1A", "passenger_id": "p1"})
    view = await aggregates.state("flight", "BA117")

The client knows the types it is given (`definitions`: the same the service registers with
`AGGREGATE_TYPES`), and checks a command's payload against its definition before sending it.

A command is an update that creates the aggregate's workflow on first use (update-with-start),
so it is answered with the events it appended, or refused with `CommandConflict` or
`InvalidCommand` (whose `reason` names the definition's own error, `SeatTaken`, if it raised
one), or `IdempotencyConflict` for a `command_id` already used by another command or payload.
`send` is the same command as a signal: recorded even while no worker runs, deduplicated by its
`command_id`, and never answered; a refused one lands in the aggregate's rejected-commands log
(`rejected`).

Concurrent commands to one aggregate from one client share updates: while one is in flight,
the next ones wait in the client's mailbox for that aggregate and go together as one `commands`
update (signals likewise, as one `send_commands` signal), each still decided on its own, in the
order they came. So one client sends at most one update at a time to an aggregate, and any number
of callers stay within Temporal's 10 updates in flight per workflow.

`effects` reads the aggregate's effect ledger (what its policies asked for, and how it went) and
`retry_effect` runs a failed effect again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal.aggregate_definition import (
    AggregateDefinition,
    by_type_name,
    describe_invalid,
)
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.connection import TemporalConnection
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.aggregate import (
    COMMANDS_SIGNAL,
    COMMANDS_UPDATE,
    EFFECTS_QUERY,
    MAX_AGGREGATE_ID_LENGTH,
    MAX_COMMAND_BATCH,
    MAX_COMMAND_ID_LENGTH,
    REJECTED_QUERY,
    RETRY_EFFECT_UPDATE,
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
    EffectRecord,
    RejectedCommand,
    aggregate_workflow_id,
)
from durable_outbox_temporal.contract.ids import OPERATIONS_TASK_QUEUE, WORKFLOW_TASK_QUEUE
from durable_outbox_temporal.errors import (
    CommandConflict,
    EffectNotFailed,
    IdempotencyConflict,
    InvalidCommand,
    InvalidRequest,
    OutboxError,
    UnknownAggregate,
    UnknownCommand,
    UnknownEffect,
)
from durable_outbox_temporal.mailbox import Mailbox
from durable_outbox_temporal.updates import update_with_start
from durable_outbox_temporal.validation import validate_key

_REFUSALS: dict[str | None, type[OutboxError]] = {
    AggregateErrorType.CONFLICT: CommandConflict,
    AggregateErrorType.INVALID: InvalidCommand,
    AggregateErrorType.UNKNOWN_COMMAND: UnknownCommand,
    AggregateErrorType.IDEMPOTENCY_CONFLICT: IdempotencyConflict,
}
_EFFECT_REFUSALS: dict[str | None, type[Exception]] = {
    AggregateErrorType.UNKNOWN_EFFECT: UnknownEffect,
    AggregateErrorType.CONFLICT: EffectNotFailed,
}
# A batch's commands as JSON, at most: well under Temporal's 2 MB payload limit.
MAX_BATCH_BYTES = 512 * 1024


@dataclass(frozen=True)
class _Addressed:
    """A command and the aggregate it goes to (every command in one mailbox goes to one)."""

    aggregate_type: str
    aggregate_id: str
    request: CommandRequest


def _command_bytes(command: _Addressed) -> int:
    return len(json.dumps(command.request.payload, default=str))


class AggregateClient:
    """Typed access to aggregates; the REST API's aggregate routes are a thin layer over it.

    `definitions` are the aggregate types it commands (a mapping by type name, or a list);
    `operations_task_queue` is where an aggregate this client starts runs its effects (the
    operations worker's queue); an aggregate keeps the queue it was started with.
    """

    def __init__(
        self,
        client: Client | TemporalConnection,
        task_queue: str = WORKFLOW_TASK_QUEUE,
        *,
        definitions: Iterable[AggregateDefinition[Any]] | Mapping[str, AggregateDefinition[Any]],
        operations_task_queue: str = OPERATIONS_TASK_QUEUE,
    ) -> None:
        self.definitions = by_type_name(definitions)
        self._connection = client if isinstance(client, TemporalConnection) else None
        self._client = client if isinstance(client, Client) else None
        self.task_queue = task_queue
        self.operations_task_queue = operations_task_queue
        self._commands: Mailbox[_Addressed, CommandOutcome] = Mailbox(
            self._send_commands,
            max_batch=MAX_COMMAND_BATCH,
            size=_command_bytes,
            max_size=MAX_BATCH_BYTES,
        )
        self._signals: Mailbox[_Addressed, None] = Mailbox(
            self._signal_commands,
            max_batch=MAX_COMMAND_BATCH,
            size=_command_bytes,
            max_size=MAX_BATCH_BYTES,
        )

    async def temporal(self) -> Client:
        if self._client is not None:
            return self._client
        assert self._connection is not None
        return await self._connection.client()

    def check(
        self,
        aggregate_type: str,
        aggregate_id: str | None = None,
        name: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> AggregateDefinition[Any]:
        """The definition, once type, id, command name and payload are known to be valid."""
        definition = self.definitions.get(aggregate_type)
        if definition is None:
            known = ", ".join(sorted(self.definitions))
            raise UnknownAggregate(f"no aggregate type {aggregate_type!r} (known: {known})")
        if aggregate_id is not None:
            validate_aggregate_id(aggregate_id)
        if name is not None and name not in definition.commands:
            known = ", ".join(definition.commands)
            raise UnknownCommand(f"{aggregate_type} has no command {name!r} (known: {known})")
        if name is not None and payload is not None:
            try:
                definition.parse_command(name, payload)
            except ValidationError as err:
                raise InvalidCommand(describe_invalid(err)) from err
        return definition

    async def command(
        self,
        aggregate_type: str,
        aggregate_id: str,
        name: str,
        payload: Mapping[str, Any],
        *,
        command_id: str | None = None,
        expected_version: int | None = None,
        actor: str | None = None,
        generated_fields: Sequence[str] = (),
    ) -> CommandResult:
        """Run a command and wait for its outcome; creates the aggregate on its first command.
        A `command_id` already used for another command or payload is an `IdempotencyConflict`,
        but for `generated_fields`: payload fields filled with fresh random values on each try."""
        self.check(aggregate_type, aggregate_id, name, payload)
        _check_command_id(command_id)
        request = CommandRequest(
            name=name,
            payload=dict(payload),
            command_id=command_id,
            expected_version=expected_version,
            actor=actor,
            generated_fields=list(generated_fields),
        )
        outcome = await self._commands.call(
            aggregate_workflow_id(aggregate_type, aggregate_id),
            _Addressed(aggregate_type, aggregate_id, request),
        )
        if outcome.result is None:
            refusal = _REFUSALS.get(outcome.error_type, InvalidCommand)
            raise refusal(outcome.message or "refused", reason=outcome.reason)
        return outcome.result

    async def send(
        self,
        aggregate_type: str,
        aggregate_id: str,
        name: str,
        payload: Mapping[str, Any],
        *,
        command_id: str,
        actor: str | None = None,
    ) -> None:
        """Record a command without waiting for it (signal-with-start); `command_id` dedupes."""
        self.check(aggregate_type, aggregate_id, name, payload)
        _check_command_id(command_id)
        if not command_id:
            raise InvalidRequest("a sent command needs a command_id")
        request = CommandRequest(
            name=name, payload=dict(payload), command_id=command_id, actor=actor
        )
        await self._signals.call(
            aggregate_workflow_id(aggregate_type, aggregate_id),
            _Addressed(aggregate_type, aggregate_id, request),
        )

    async def _send_commands(self, _: str, commands: list[_Addressed]) -> list[CommandOutcome]:
        """One update carrying a mailbox's batch, starting the aggregate if it has no workflow."""
        aggregate_type, aggregate_id = commands[0].aggregate_type, commands[0].aggregate_id
        client = await self.temporal()
        batch = CommandBatch(commands=[command.request for command in commands])
        try:
            result = await update_with_start(
                client,
                COMMANDS_UPDATE,
                batch,
                start=lambda: WithStartWorkflowOperation(
                    WORKFLOW_TYPE,
                    self._input(aggregate_type, aggregate_id),
                    **self._start_options(aggregate_type, aggregate_id),
                ),
                result_type=CommandBatchResult,
                rpc_timeout=RPC_TIMEOUT,
            )
        except WorkflowUpdateFailedError as err:
            raise _refusal(err) from err
        return result.outcomes

    async def _signal_commands(self, _: str, commands: list[_Addressed]) -> list[None]:
        """One signal carrying a mailbox's batch, starting the aggregate if it has no workflow."""
        aggregate_type, aggregate_id = commands[0].aggregate_type, commands[0].aggregate_id
        client = await self.temporal()
        await client.start_workflow(
            WORKFLOW_TYPE,
            self._input(aggregate_type, aggregate_id),
            start_signal=COMMANDS_SIGNAL,
            start_signal_args=[CommandBatch(commands=[command.request for command in commands])],
            rpc_timeout=RPC_TIMEOUT,
            **self._start_options(aggregate_type, aggregate_id),
        )
        return [None] * len(commands)

    async def state(self, aggregate_type: str, aggregate_id: str) -> AggregateView:
        """The live state, version and read models; `UnknownAggregate` if it has none."""
        view: AggregateView = await self._query(
            aggregate_type, aggregate_id, STATE_QUERY, AggregateView
        )
        return view

    async def rejected(self, aggregate_type: str, aggregate_id: str) -> list[RejectedCommand]:
        """Signalled and timer commands the aggregate refused, newest last."""
        rejected: list[RejectedCommand] = await self._query(
            aggregate_type, aggregate_id, REJECTED_QUERY, list[RejectedCommand]
        )
        return rejected

    async def effects(self, aggregate_type: str, aggregate_id: str) -> list[EffectRecord]:
        """The aggregate's effect ledger, oldest first (done ones: the newest only)."""
        effects: list[EffectRecord] = await self._query(
            aggregate_type, aggregate_id, EFFECTS_QUERY, list[EffectRecord]
        )
        return effects

    async def retry_effect(self, aggregate_type: str, aggregate_id: str, key: str) -> EffectRecord:
        """Run a failed effect again; `UnknownEffect` or `EffectNotFailed` if it cannot be."""
        handle = await self._handle(aggregate_type, aggregate_id)
        try:
            record: EffectRecord = await handle.execute_update(
                RETRY_EFFECT_UPDATE, key, result_type=EffectRecord, rpc_timeout=RPC_TIMEOUT
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type in _EFFECT_REFUSALS:
                raise _EFFECT_REFUSALS[cause.type](cause.message) from err
            raise
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and await _ended(handle):
                # A run ends idle only with no failed effect in its ledger.
                raise UnknownEffect(
                    f"no failed effect {key!r}: {aggregate_type} {aggregate_id!r} ended idle,"
                    " with none"
                ) from err
            if err.status == RPCStatusCode.NOT_FOUND:
                raise UnknownAggregate(f"no {aggregate_type} {aggregate_id!r}") from err
            raise
        return record

    async def _query(
        self, aggregate_type: str, aggregate_id: str, query: str, result_type: type[Any]
    ) -> Any:
        handle = await self._handle(aggregate_type, aggregate_id)
        try:
            return await handle.query(query, result_type=result_type, rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise UnknownAggregate(f"no {aggregate_type} {aggregate_id!r}") from err
            raise

    def _input(self, aggregate_type: str, aggregate_id: str) -> AggregateInput:
        return AggregateInput(
            type=aggregate_type,
            id=aggregate_id,
            operations_task_queue=self.operations_task_queue,
            passivate_after_s=self.definitions[aggregate_type].passivate_after_s(),
        )

    async def _handle(self, aggregate_type: str, aggregate_id: str) -> WorkflowHandle[Any, Any]:
        self.check(aggregate_type, aggregate_id)
        client = await self.temporal()
        return client.get_workflow_handle(aggregate_workflow_id(aggregate_type, aggregate_id))

    def _start_options(self, aggregate_type: str, aggregate_id: str) -> dict[str, Any]:
        return {
            "id": aggregate_workflow_id(aggregate_type, aggregate_id),
            "task_queue": self.task_queue,
            "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
            "search_attributes": TypedSearchAttributes(
                [SearchAttributePair(search_attributes.AGGREGATE_TYPE, aggregate_type)]
            ),
            "static_summary": f"{aggregate_type} {aggregate_id}",
        }


async def _ended(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the aggregate's latest run has ended (idle: the next command starts another)."""
    try:
        description = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status != WorkflowExecutionStatus.RUNNING


def validate_aggregate_id(aggregate_id: str) -> None:
    """An aggregate id follows the rules of an item key (one URL path segment)."""
    try:
        validate_key(aggregate_id)
    except InvalidRequest as err:
        raise InvalidRequest(str(err).replace("key", "aggregate id")) from err
    if len(aggregate_id) > MAX_AGGREGATE_ID_LENGTH:
        raise InvalidRequest(f"aggregate id longer than {MAX_AGGREGATE_ID_LENGTH} characters")


def _check_command_id(command_id: str | None) -> None:
    if command_id is not None and not 0 < len(command_id) <= MAX_COMMAND_ID_LENGTH:
        raise InvalidRequest(f"command_id must be 1 to {MAX_COMMAND_ID_LENGTH} characters")


def _refusal(err: WorkflowUpdateFailedError) -> Exception:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        error = _REFUSALS.get(cause.type, InvalidCommand)
        reason = cause.details[0] if cause.details and isinstance(cause.details[0], str) else None
        return error(cause.message, reason=reason)
    return InvalidCommand(str(cause))
