"""The Temporal contract page (`docs/reference/contract.md`): the item, lane and aggregate
workflows' signals, updates and queries, generated from the workflows' own definitions and the
contract's dataclasses, so the documentation cannot drift. `python -m devstack.reference_docs`
writes it with the other reference pages.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from durable_outbox_temporal.contract.aggregate import AggregateView
from durable_outbox_temporal.contract.bulk import ENQUEUE_SIGNAL, ShardEnqueue
from durable_outbox_temporal.contract.debounce import DebounceWindowView
from durable_outbox_temporal.contract.flow import FlowState
from durable_outbox_temporal.contract.ids import WORKFLOW_TASK_QUEUE
from durable_outbox_temporal.contract.item import OutboxItemView
from durable_outbox_temporal.contract.lane import LaneView
from temporalio.workflow import _Definition

from workflows.aggregate import AggregateWorkflow
from workflows.debounce import DebounceWindowWorkflow
from workflows.destination_flow import DestinationFlowWorkflow
from workflows.lane import OutboxLaneWorkflow
from workflows.outbox_item import OutboxItemWorkflow

# Where each handler is for, and how a service in any language calls it with the CLI.
_USES = {
    "throttled": (
        "a submit met a throttle and paused the submit queue until `until`; sent by the submit"
        " activity (signal-with-start), not by hand"
    ),
    "failing": (
        "a worker process's submits to the destination failed above its breaker's threshold;"
        " sent by the submit activity (signal-with-start), not by hand: the flow opens the"
        " circuit"
    ),
    "submit_outcomes": (
        "a worker process's submits to an adaptive destination over its last interval (answered"
        " within the latency target, slower, congested); sent by the submit activity"
        " (signal-with-start), not by hand: the flow moves the submit rate"
        " (`flowcontrol/adaptive.py`)"
    ),
    "breaker_settings": (
        "the breaker's settings changed at run time; sent by `PATCH /v1/destinations/{name}`:"
        " an open circuit follows them, and closes at once when the breaker is turned off"
    ),
    "flow": (
        "the throttle rule's and the circuit's state: storms, the share of the rate in force,"
        " the circuit (open or closed, next probe), newest events"
    ),
    "status": "the live view",
    "cancel": "cancel a queued item; the validator refuses any other (answered by a worker)",
    "request_cancel": (
        "the same cancel, recorded even while no worker runs; applied if still queued then"
    ),
    "command": (
        "run a command: decide, append, evolve; answers the events and version, or fails with"
        " `Conflict`, `InvalidCommand` or `UnknownCommand` (answered by a worker)"
    ),
    "send_command": (
        "the same command, recorded even while no worker runs; `command_id` required (dedupe);"
        " a refused one goes to the rejected log"
    ),
    "commands": (
        "up to 100 commands in one update, run in order as `command` runs each, with one outcome"
        " per command (its result, or its refusal's `error_type` and `message`); how a busy"
        " client stays within Temporal's 10 updates in flight per workflow"
    ),
    "send_commands": (
        "up to 100 signalled commands in one signal, each run as `send_command` runs it"
    ),
    "state": "state, version and the definition's read models",
    "rejected_commands": "signalled and timer commands `decide` refused, newest last",
    "effects": (
        "the effect ledger, oldest first: each effect's key, kind, action, status (pending, done,"
        " failed), executions, error and result"
    ),
    "retry_effect": (
        "run a failed effect again, by its key (fails with `UnknownEffect`, or `Conflict` for one"
        " that has not failed)"
    ),
    "append_items": (
        "add up to 100 items at their lanes' tails, in order (send it with update-with-start,"
        " id conflict policy USE_EXISTING); answers each item's outcome: `queued`, `duplicate`,"
        " `conflict` (the key is in the lane with another request) or `full`. The items carry"
        " their destination's policy snapshot, so append through the API or"
        " `OutboxClient.enqueue` with an `ordering_key` rather than by hand"
    ),
    "append_items_unconfirmed": (
        "the same append as a signal, recorded even while no worker runs (what the client sends"
        " when no worker answered the update in time)"
    ),
    "lane": (
        "a lane's view (by lane id, `lane/{outbox}/{ordering_key}`), the first keys waiting"
        " behind its head, the bytes it carries; fails for a lane the workflow does not hold"
    ),
    "remove": (
        "cancel waiting items (one key, a destination's, or all; `outbox` and `ordering_key`"
        " name the lanes in a shard); a head only when named by `key` and not yet handed to"
        " the provider"
    ),
    "enqueue_items": (
        "items for the shard to hold (a batch enqueue sends one signal per shard); items with"
        " an `ordering_key` join their lane, in order. Written by `OutboxClient`; not by hand"
    ),
    "cancel_item": "cancel one held item (by item id) if it is still queued",
    "item_delivery_report": "a delivery report for one held item, by item id",
    "shard": "what the workflow holds: items by status, lanes and the items in them",
    "redrive_head": "run a halted lane's failed head item again (a new generation)",
    "skip_head": "move a halted lane past its failed head item, which stays failed",
    "join": (
        "debounced items joining their key's window, in order (update-with-start, id conflict"
        " policy USE_EXISTING); answers each item's outcome: `created`, `member` (the key is in"
        " the window with the same request), `conflict` (with another request) or `mode`"
        " (another debounce_mode than the window's). Sent by `OutboxClient`; not by hand"
    ),
    "leave": (
        "cancel a member still in the window (by key): its cancelled view; none once the window"
        " closed"
    ),
    "window": "the open window's member keys, its mode, when it opened and when it closes",
    "delivery_report": (
        "the provider's report on one recipient (the API sends it from Event Grid); a repeat"
        " or an older report changes nothing"
    ),
}
_CLI = {
    "signal": "temporal workflow signal --workflow-id {id} --name {name} --input '{example}'",
    "update": (
        "temporal workflow update execute --workflow-id {id} --name {name} --input '{example}'"
    ),
    "query": "temporal workflow query --workflow-id {id} --name {name}",
    "query with input": (
        "temporal workflow query --workflow-id {id} --name {name} --input '{example}'"
    ),
}
# Handlers whose payload no one should write by hand (see their description).
_NO_CLI = {"append_items", "append_items_unconfirmed", "enqueue_items", "join"}
# Handlers that take their payload raw and read it themselves (`workflows.host.enqueue_items`
# leaves a burst's payloads unread): the JSON they read.
_READ_BY_HANDLER: dict[str, type[Any]] = {ENQUEUE_SIGNAL: ShardEnqueue}
# Examples by handler, where the payload's type alone does not say what a value looks like.
_HANDLER_EXAMPLES = {
    "retry_effect": '"flight:BA117:2:mirror"',
    "lane": '"lane/demo/customer-7"',
}
_EXAMPLES = {
    "CommandRequest": (
        '{"name": "assign_seat", "payload": {"seat": "1A", "passenger_id": "p1"},'
        ' "command_id": "c-42"}'
    ),
    "CommandBatch": (
        '{"commands": [{"name": "assign_seat", "payload": {"seat": "1A", "passenger_id": "p1"},'
        ' "command_id": "c-42"}, {"name": "release_seat", "payload": {"seat": "2C"},'
        ' "command_id": "c-43"}]}'
    ),
    "CancelRequest": '{"reason": "customer left"}',
    "RemoveRequest": '{"key": "invoice-8", "reason": "customer left"}',
    "RedriveHead": '{"key": "invoice-8"}',
    "DebounceLeave": '{"key": "profile-42-edit-7", "reason": "customer left"}',
    "SkipHead": '{"key": "invoice-8", "reason": "bad address"}',
    "ItemCancel": '{"item_id": "outbox/demo/invoice-8", "request": {"reason": "customer left"}}',
    "str": '"8c1d9e52-0d4a-4f0e-9d7c-5b3f7a1e2c40"',
    "DeliveryReport": (
        '{"message_id": "0b6d7c7e-8f40-5b7e-9a6c-1f2d3e4a5b6c", "recipient": "ada@example.com",'
        ' "status": "bounced", "at": "2026-11-23T10:00:00Z", "detail": "550 5.1.1"}'
    ),
}


@dataclasses.dataclass(frozen=True)
class _Workflow:
    cls: type[Any]
    id_pattern: str
    example_id: str
    input_name: str
    view: type[Any]
    what: str


_WORKFLOWS = (
    _Workflow(
        OutboxItemWorkflow,
        "outbox/{outbox}/{key}",
        "'outbox/demo/invoice-7'",
        "OutboxItemInput",
        OutboxItemView,
        "one item",
    ),
    _Workflow(
        OutboxLaneWorkflow,
        "lane/{outbox}/{ordering_key}",
        "'lane/demo/customer-7'",
        "ShardInput",
        LaneView,
        "one ordering lane (item mode); started by its first append (update-with-start); runs"
        " its items one at a time, in the order it received them, with each item's own submit"
        " and poll activities (no workflow per item: each item's story is in the read model)",
    ),
    _Workflow(
        DestinationFlowWorkflow,
        "flow/{destination}",
        "'flow/fake-webhook'",
        "FlowState",
        FlowState,
        "one destination's throttle rule and circuit breaker (`flowcontrol/throttle.py`,"
        " `flowcontrol/breaker.py`); started by the first submit that meets a 429 or 503 with"
        " Retry-After, or by a worker whose submits keep failing; resumes the submit queue on a"
        " durable timer, or opens the circuit, probes and closes it; ends once the rate is whole,"
        " the circuit closed and nothing came for five minutes",
    ),
    _Workflow(
        DebounceWindowWorkflow,
        "debounce/{outbox}/{destination}/{debounce_key}",
        "'debounce/demo/fake-webhook/profile-42'",
        "DebounceInput",
        DebounceWindowView,
        "one debounce window (`durable_outbox_temporal/contract/debounce_rules.py`); started by"
        " its first item's `join`;"
        " closes on a durable timer, hands its carrier to the item's usual placement and marks"
        " the others superseded; ends when no item waits",
    ),
    _Workflow(
        AggregateWorkflow,
        "agg/{type}/{id}",
        "'agg/flight/BA117'",
        "AggregateInput",
        AggregateView,
        "one aggregate; started by its first command (update-with-start or signal-with-start,"
        " id conflict policy USE_EXISTING)",
    ),
)


def contract_page() -> str:
    """The whole page: what the table is for, then the table."""
    return "\n".join(
        [
            "# The Temporal contract",
            "",
            "Every workflow, signal, update and query a service in any language may call, generated"
            " from the workflows' definitions and the contract's dataclasses"
            " (`python -m devstack.reference_docs`; a test fails when this page is stale). Use an"
            " update where you need the answer now, a signal where the fact must be recorded even"
            " while no worker runs.",
            "",
            contract_table(),
            "",
        ]
    )


def contract_table() -> str:
    """The handlers' table, the views' fields and a `temporal` CLI call for each handler."""
    rows = [
        "| Name | Kind | JSON payload | Answer | What for |",
        "|---|---|---|---|---|",
    ]
    commands: list[str] = []
    views: list[str] = []
    for workflow in _WORKFLOWS:
        definition = _Definition.must_from_class(workflow.cls)
        rows.append(
            f"| `{definition.name}` | workflow, id `{workflow.id_pattern}`, task queue "
            f"`{WORKFLOW_TASK_QUEUE}` | `{workflow.input_name}` | `{workflow.view.__name__}` |"
            f" {workflow.what} |"
        )
        handlers: list[tuple[str, str, list[Any], Any]] = []
        for name, query in definition.queries.items():
            handlers.append((str(name), "query", list(query.arg_types or []), query.ret_type))
        for name, update in definition.updates.items():
            handlers.append((str(name), "update", list(update.arg_types or []), update.ret_type))
        for name, signal in definition.signals.items():
            read = _READ_BY_HANDLER.get(str(name))
            arg_types = [read] if read else list(signal.arg_types or [])
            handlers.append((str(name), "signal", arg_types, None))
        for name, kind, arg_types, ret_type in sorted(handlers, key=lambda h: (h[1], h[0])):
            payload = describe(arg_types[0]) if arg_types else "—"
            answer = _answer(ret_type)
            rows.append(f"| `{name}` | {kind} | {payload} | {answer} | {_USES[name]} |")
            if name in _NO_CLI:
                continue
            example = (
                _HANDLER_EXAMPLES.get(name) or _EXAMPLES.get(arg_types[0].__name__, "{}")
                if arg_types
                else ""
            )
            template = _CLI["query with input" if kind == "query" and arg_types else kind]
            commands.append(template.format(id=workflow.example_id, name=name, example=example))
        fields = ", ".join(f"`{field.name}`" for field in dataclasses.fields(workflow.view))
        views.append(f"`{workflow.view.__name__}` (JSON object): {fields}.")
    return "\n".join(
        [*rows, "", *[line for view in views for line in (view, "")], "```sh", *commands, "```"]
    )


def _answer(ret_type: Any) -> str:
    if ret_type is None:
        return "— (recorded)"
    if typing.get_origin(ret_type) is list:
        return f"list of `{typing.get_args(ret_type)[0].__name__}`"
    return f"`{ret_type.__name__}`"


def describe(cls: type[Any]) -> str:
    """`Name` `{"field": type = default, ...}` for a dataclass payload; a JSON type else."""
    if not dataclasses.is_dataclass(cls):
        return f"{_json_type(cls)}"
    hints = typing.get_type_hints(cls)
    members = []
    for field in dataclasses.fields(cls):
        text = f'"{field.name}": {_json_type(hints[field.name])}'
        if field.default is not dataclasses.MISSING:
            default = field.default
            if isinstance(default, enum.Enum):
                default = default.value
            text += f" = {default!r}".replace("'", '"')
        members.append(text)
    return f"`{cls.__name__}` `{{{', '.join(members)}}}`"


def _json_type(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " \\| ".join(_json_type(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " \\| ".join(f'"{member.value}"' for member in hint)
    if typing.get_origin(hint) is dict or hint is dict:
        return "object"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
