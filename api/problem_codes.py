"""Every problem `code` the API answers with: its HTTP status, what it means and what to do.

One table, read three ways: `api/errors.py` gives each problem+json answer its `code` (and the
`type` URI `/problems/<code>`), `GET /problems/<code>` shows the entry as a page, and
`docs/reference/problems.md` lists them all (`python -m devstack.reference_docs`). Codes are
stable: clients script against them, so one is never renamed, only added.

An aggregate's own refusals (`SeatTaken` in `examples/flight/domainmodel.py`) are codes too,
named from the `DomainError` class (`seat-taken`) and documented from its docstring: those of the
types `AGGREGATE_TYPES` registers. Such a code refines a
broader one: the answer keeps that one's `type` (`/problems/command-conflict`), as it had before
codes existed, so clients matching on `type` still do.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from durable_outbox_temporal.aggregate_definition import Conflict, DomainError, InvalidCommand

from configuration.settings import get_settings
from service.aggregate_types import load_aggregate_types
from service.reports import EARLY_REPORT_WINDOW

# How recent an unknown report must be to be sent back (`reports-not-yet-recorded`).
_EARLY_MINUTES = int(EARLY_REPORT_WINDOW.total_seconds() // 60)


@dataclass(frozen=True)
class ProblemCode:
    """One kind of problem: the status it answers with, what it means, what the caller does."""

    code: str
    status: int | None  # None: the answer's own status (the fallback code)
    meaning: str
    remedy: str
    # The broader code whose `type` the answer carries; None: its own.
    refines: str | None = None

    @property
    def type_code(self) -> str:
        """The code the answer's `type` URI names."""
        return self.refines or self.code


_RETRY_LATER = "Retry after the `Retry-After` seconds; nothing was done."
_FIX_REQUEST = "Fix the request as `detail` (and `errors`, per field) says; do not retry as is."
_READ_THEN_DECIDE = (
    "Read the aggregate's state (`GET /v1/aggregates/{type}/{id}`) and decide again; the same"
    " command may succeed once the state has changed."
)

_GENERAL = (
    # Requests the API cannot take as sent.
    ProblemCode("bad-request", 400, "The request is malformed.", _FIX_REQUEST),
    ProblemCode(
        "malformed-json", 400, "The body is not valid JSON.", "Send a valid JSON document."
    ),
    ProblemCode(
        "invalid-host",
        400,
        "The `Host` header names a host this API does not serve (`ALLOWED_HOSTS`).",
        "Call the API by a host name it serves, or add the name to `ALLOWED_HOSTS`.",
    ),
    ProblemCode(
        "missing-origin",
        400,
        "A CloudEvents validation request came without `WebHook-Request-Origin`.",
        "Send the header, as Event Grid does.",
    ),
    ProblemCode(
        "not-an-event-grid-delivery",
        400,
        "The body posted to a delivery-report endpoint is not an Event Grid or CloudEvents batch.",
        "Post the provider's reports unchanged.",
    ),
    ProblemCode(
        "bad-payload",
        400,
        "A codec payload is not base64.",
        "Send the payloads as the Web UI does.",
    ),
    ProblemCode(
        "unauthorized",
        401,
        "No bearer token was sent, and the route needs one.",
        "Send `Authorization: Bearer <token>`.",
    ),
    ProblemCode(
        "bad-events-secret",
        401,
        "A delivery report came without the destination's `events_secret`, or with another.",
        "Send the secret as `?secret=` or the `X-Events-Secret` header.",
    ),
    ProblemCode(
        "forbidden",
        403,
        "The token is not valid, or lacks the scope or outbox the route needs (`missing_scope`).",
        "Use a token with that scope and outbox (`GET /v1/token` shows what a token may do).",
    ),
    ProblemCode(
        "actor-not-allowed",
        403,
        "The command names an actor (`actor`) the token may not act as.",
        "Name an actor the token may act as, or use that actor's token.",
    ),
    ProblemCode(
        "not-found",
        404,
        "No route answers this path.",
        "Check the URL against the API reference (`/docs`).",
    ),
    ProblemCode(
        "method-not-allowed",
        405,
        "The route does not take this method.",
        "Use a method the route takes (`/docs`).",
    ),
    ProblemCode(
        "request-too-large",
        413,
        "The body is over `MAX_REQUEST_BYTES` (over `CODEC_MAX_REQUEST_BYTES` for `/codec/`),"
        " or an item's payload is over its `http` destination's `max_body_bytes`.",
        "Send less: split a batch, or store big payloads elsewhere and send a reference.",
    ),
    ProblemCode(
        "too-many-payloads",
        413,
        "A `/codec/` request carries more than `CODEC_MAX_PAYLOADS` payloads.",
        "Split the payloads over several requests.",
    ),
    ProblemCode(
        "unsupported-media-type",
        415,
        "The body was not sent as JSON.",
        "Send it with `Content-Type: application/json`.",
    ),
    ProblemCode("invalid-request", 422, "A field or parameter is invalid.", _FIX_REQUEST),
    ProblemCode(
        "invalid-cursor",
        422,
        "A page cursor (`after`) is not one this API handed out.",
        "Pass back the `next_after` of the previous page unchanged, or start again without it.",
    ),
    ProblemCode(
        "too-deeply-nested",
        422,
        "Arrays and objects nest deeper than `max_depth` in the body.",
        "Flatten the document.",
    ),
    ProblemCode(
        "undecodable-payload",
        422,
        "The codec cannot decode a payload: an unknown key id, or not a payload it wrote.",
        "Give the API the key the payload was encrypted with (`PAYLOAD_KEYS`).",
    ),
    ProblemCode(
        "rate-limited",
        429,
        "Too many requests.",
        _RETRY_LATER,
    ),
    ProblemCode(
        "internal",
        500,
        "A bug in the API; the server logged it with its traceback.",
        "Report it with the time and `instance`; retrying may not help.",
    ),
    ProblemCode(
        "not-supported-by-temporal",
        501,
        "The Temporal server behind the API does not support the call (a test server, say).",
        "Run the API against a full Temporal server.",
    ),
    ProblemCode(
        "unavailable",
        503,
        "The API cannot serve the request now.",
        _RETRY_LATER,
    ),
    ProblemCode(
        "temporal-unavailable",
        503,
        "Temporal did not answer (down, overloaded, or the call timed out or was cancelled).",
        _RETRY_LATER + " An enqueue retried with the same `Idempotency-Key` happens once.",
    ),
    ProblemCode(
        "reports-not-yet-recorded",
        503,
        "Delivery reports name a message no item holds yet, about a delivery attempt of the last"
        f" {_EARLY_MINUTES} minutes: the item's record of its send may not be written yet. The"
        " delivery's other reports were applied.",
        "Deliver the same reports again after `Retry-After` (Event Grid does by itself); a"
        f" repeat changes nothing. After {_EARLY_MINUTES} minutes such a report is accepted as"
        " `unknown`.",
    ),
    ProblemCode(
        "database-unavailable",
        503,
        "The read-model database did not answer.",
        _RETRY_LATER,
    ),
    ProblemCode(
        "schema-not-at-head",
        503,
        "The read-model database lacks a table or column this release uses (`missing` names"
        " it): its schema was not migrated to this release's head revisions.",
        "Run `alembic upgrade heads` with this release's `DATABASE_URL` (or start a worker, which"
        " migrates at start-up); retrying without it does not help. `/readyz` says the same.",
    ),
    ProblemCode(
        "payload-key-missing",
        503,
        "A stored value (a payload, an address, an event's data) is encrypted under a payload key"
        " this API does not have (`key_id` names it), or under another key of that id.",
        "Give the API every key the read model's values were sealed with (`PAYLOAD_KEYS`, the"
        " newest first; docs/how-to/security.md); retrying without it does not help.",
    ),
    ProblemCode(
        "not-ready",
        503,
        "A dependency the API needs is unreachable or not set up (`down` lists them: `temporal`,"
        " `database`, `schema` behind this release, `search_attributes` missing); `detail` says"
        " what to do for the last two.",
        "Wait for what is down; migrate the schema (`alembic upgrade heads`) or register the"
        " search attributes as `detail` says. `/readyz` turns 200 when the API can serve.",
    ),
    ProblemCode(
        "error",
        None,
        "An HTTP error without a more specific code; `status` says which.",
        "Read `title` and `detail`.",
    ),
)

_ITEMS = (
    ProblemCode(
        "unknown-destination",
        404,
        "No destination of that name is configured.",
        "Use a destination the outbox has (`GET /v1/destinations`).",
    ),
    ProblemCode(
        "item-not-found", 404, "No item with that outbox and key.", "Check the outbox and key."
    ),
    ProblemCode(
        "item-pruned",
        410,
        "The item ended longer ago than its `item_retention_s` and Temporal's retention: its row"
        " and history are gone, and only its key's memory is left. The answer says how it ended"
        " (`item_status`, `finished_at`) and when its row went (`pruned_at`).",
        "Do not enqueue it again under a new key to learn its fate: it ended as `item_status`"
        " says, and a repeat of its key is answered, never sent again.",
    ),
    ProblemCode(
        "idempotency-conflict",
        409,
        "The `Idempotency-Key` is already used by an item (or an aggregate command) with another"
        " destination, payload or ordering key (or another command or payload).",
        "Use a new key for a new request; repeat a key only with the same request.",
    ),
    ProblemCode(
        "item-failed",
        409,
        "The key belongs to an item that failed permanently; enqueueing it again does nothing."
        " The problem's `redrive` link redrives it.",
        "Redrive the item (`POST` the `redrive` link) to try it again.",
    ),
    ProblemCode(
        "cannot-cancel",
        409,
        "The item is past the point where cancelling could stop it.",
        "Nothing to do: it is being (or was) delivered.",
    ),
    ProblemCode(
        "not-redrivable",
        409,
        "Only a failed, terminated or timed-out item can be redriven.",
        "Read the item: it is still under way, or it was sent.",
    ),
    ProblemCode(
        "item-erased",
        409,
        "The item's payload was erased (`DELETE .../payload`): there is nothing to send again.",
        "Enqueue a new item with the payload under a new key.",
    ),
    ProblemCode(
        "payload-pruned",
        409,
        "The item ended longer ago than its destination's (or outbox's) `payload_retention_s`:"
        " retention removed its payload, so there is nothing to send again.",
        "Enqueue a new item with the payload under a new key.",
    ),
    ProblemCode(
        "not-erasable",
        409,
        "Only an item that has ended (sent, failed, cancelled or superseded) can be erased; a sent"
        " one once its delivery reports' window has passed, a superseded one once the carrier"
        " holding its copy has ended (`detail` says which).",
        "Wait for the item (or its carrier, or its report window) to end, or cancel it first.",
    ),
    ProblemCode(
        "not-a-dead-letter",
        409,
        "The item has not failed, so it is not a dead letter.",
        "Read the item's status.",
    ),
    ProblemCode(
        "lane-full",
        429,
        "The item's ordering lane holds as many waiting items as it can.",
        "Retry after the `Retry-After` seconds; the item was not enqueued.",
    ),
    ProblemCode(
        "lane-not-found",
        404,
        "No running ordering lane of that outbox and key (it never ran, or ended when idle).",
        "Check the outbox and ordering key.",
    ),
    ProblemCode(
        "lane-not-halted",
        409,
        "Only a halted lane's head item can be redriven or skipped through the lane.",
        "Read the lane: it is delivering.",
    ),
    ProblemCode(
        "purge-batch-not-found", 404, "No purge batch with that id.", "Check the batch id."
    ),
    ProblemCode(
        "redrive-batch-not-found", 404, "No redrive batch with that id.", "Check the batch id."
    ),
    ProblemCode("replay-not-found", 404, "No replay with that id.", "Check the replay id."),
    ProblemCode(
        "replay-confirmation-required",
        409,
        "The replay's filter selects more items than `REPLAY_CONFIRM_OVER` without"
        " `confirm_count`; the problem's `count` says how many.",
        "Narrow the filter, or send `confirm_count` equal to `count`.",
    ),
    ProblemCode(
        "reseal-batch-not-found", 404, "No reseal batch with that id.", "Check the batch id."
    ),
    ProblemCode(
        "no-payload-keys",
        409,
        "A reseal needs payload keys: this API has none (`PAYLOAD_KEYS`), so no key to seal under.",
        "Set `PAYLOAD_KEYS` (or `PAYLOAD_KEYS_FILE`) on the API and the worker, then start again.",
    ),
    ProblemCode(
        "erase-batch-not-found", 404, "No erase batch with that id.", "Check the batch id."
    ),
    ProblemCode(
        "schedule-not-found", 404, "No schedule of that name.", "Check the schedule's name."
    ),
    ProblemCode(
        "schedule-exists",
        409,
        "A schedule of that name exists already.",
        "Pick another name, or update or delete the existing one.",
    ),
    ProblemCode(
        "unknown-projector", 404, "No projector of that name.", "List them: `GET /v1/projectors`."
    ),
    ProblemCode(
        "no-event-endpoint",
        404,
        "The destination takes no delivery reports (it has no `events_secret`).",
        "Set the destination's `events_secret`.",
    ),
)

_AGGREGATES = (
    ProblemCode(
        "unknown-aggregate",
        404,
        "No aggregate type of that name, or no aggregate with that id.",
        "List the types: `GET /v1/aggregates`.",
    ),
    ProblemCode(
        "unknown-command",
        404,
        "The aggregate type has no command of that name.",
        "List its commands: `GET /v1/aggregates`.",
    ),
    ProblemCode(
        "command-conflict",
        409,
        "The aggregate refused the command: it clashes with the aggregate's state.",
        _READ_THEN_DECIDE,
    ),
    ProblemCode(
        "version-conflict",
        409,
        "`expected_version` is not the aggregate's version: another command came first.",
        "Read the state and its version, decide again and send with the new version.",
        refines="command-conflict",
    ),
    ProblemCode(
        "invalid-command",
        422,
        "The command's payload does not fit, or the aggregate says it can never succeed.",
        _FIX_REQUEST,
    ),
    ProblemCode(
        "unknown-effect", 404, "The effect ledger holds no effect with that key.", "Check the key."
    ),
    ProblemCode(
        "effect-not-failed",
        409,
        "Only a failed effect can be retried; this one is pending or done.",
        "Read the ledger (`GET .../effects`).",
    ),
)

# The code of an answer whose raise site names none (Starlette's own HTTP errors, say).
STATUS_CODES: dict[int, str] = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "request-too-large",
    415: "unsupported-media-type",
    422: "invalid-request",
    429: "rate-limited",
    500: "internal",
    501: "not-supported-by-temporal",
    503: "unavailable",
}
FALLBACK_CODE = "error"


def domain_code(error_name: str) -> str:
    """An aggregate's refusal as a code: `SeatTaken` -> `seat-taken`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", error_name).lower()


def domain_errors() -> list[tuple[str, type[DomainError]]]:
    """Each registered aggregate type's own refusal classes (not the `Conflict` and
    `InvalidCommand` bases, which have codes of their own), by type, in definition order."""
    found = []
    definitions = load_aggregate_types(get_settings().aggregate_types).definitions
    for type_name, definition in sorted(definitions.items()):
        module = sys.modules[type(definition).__module__]
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, DomainError)
                and value.__module__ == module.__name__
                and value not in (Conflict, InvalidCommand)
            ):
                found.append((type_name, value))
    return found


def _domain_codes() -> tuple[ProblemCode, ...]:
    codes = []
    for type_name, error in domain_errors():
        meaning = " ".join((error.__doc__ or error.__name__).split())
        refuses = f"A `{type_name}` aggregate refused the command (`{error.__name__}`): {meaning}"
        code = domain_code(error.__name__)
        if issubclass(error, Conflict):
            codes.append(ProblemCode(code, 409, refuses, _READ_THEN_DECIDE, "command-conflict"))
        else:
            codes.append(ProblemCode(code, 422, refuses, _FIX_REQUEST, "invalid-command"))
    return tuple(codes)


# Sections of the reference, in order, each with its codes.
SECTIONS: dict[str, tuple[ProblemCode, ...]] = {
    "Requests, tokens and the service": _GENERAL,
    "Items, lanes, batches and schedules": _ITEMS,
    "Aggregates": _AGGREGATES,
    "Aggregates' own refusals": _domain_codes(),
}
PROBLEM_CODES: dict[str, ProblemCode] = {
    problem.code: problem for section in SECTIONS.values() for problem in section
}
