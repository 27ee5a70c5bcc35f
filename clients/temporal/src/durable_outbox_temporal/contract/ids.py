"""Identifiers: workflow ids, task queue names and provider idempotency keys, in one place."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

# A fixed namespace so the provider idempotency key of an item never changes, in any process.
_PROVIDER_KEY_NAMESPACE = uuid.UUID("5b0f1c8e-3f3a-4c55-9c55-0d0b7e1a9d21")

# The default task queue of the workflow worker (`WORKFLOW_TASK_QUEUE` overrides it).
WORKFLOW_TASK_QUEUE = "outbox-workflows"
# The default task queue of the operations worker (`OPERATIONS_TASK_QUEUE` overrides it): the
# activities the workflow worker's workflows need beside their local ones (scheduled fan-out,
# dead-letter redrive batches).
OPERATIONS_TASK_QUEUE = "outbox-operations"


def item_workflow_id(outbox: str, key: str) -> str:
    """The one workflow id of an item: `outbox/{outbox}/{key}`."""
    return f"outbox/{outbox}/{key}"


def lane_workflow_id(outbox: str, ordering_key: str) -> str:
    """The one workflow id of an ordering lane: `lane/{outbox}/{ordering_key}`."""
    return f"lane/{outbox}/{ordering_key}"


def temporal_schedule_id(schedule_id: str) -> str:
    """The Temporal Schedule of a scheduled fan-out: `schedule/{schedule_id}`."""
    return f"schedule/{schedule_id}"


def scheduled_batch_workflow_id(schedule_id: str) -> str:
    """The workflow id a schedule's action starts with; Temporal appends `-{fire time}` to it,
    so each fire time has one workflow id."""
    return f"scheduled-batch/{schedule_id}"


def redrive_batch_workflow_id(outbox: str, batch_id: str) -> str:
    """A dead-letter redrive batch: `redrive-batch/{outbox}/{batch_id}`."""
    return f"redrive-batch/{outbox}/{batch_id}"


def parse_item_workflow_id(workflow_id: str) -> tuple[str, str]:
    """Inverse of `item_workflow_id`: returns `(outbox, key)`."""
    prefix, _, rest = workflow_id.partition("/")
    outbox, _, key = rest.partition("/")
    if prefix != "outbox" or not outbox or not key:
        raise ValueError(f"not an outbox item workflow id: {workflow_id!r}")
    return outbox, key


def provider_idempotency_key(item_id: str, generation: int = 0) -> str:
    """A UUID derived from the item id: ACS `Operation-Id`, Standard Webhooks `webhook-id`.

    Stable across the retries and workers of one generation of an item, so a provider that
    dedupes never delivers it twice. Each redrive is a new generation with a key of its own: a
    provider that dedupes would answer the old key with the operation that failed.
    """
    name = item_id if generation == 0 else f"{item_id}#redrive-{generation}"
    return str(uuid.uuid5(_PROVIDER_KEY_NAMESPACE, name))


def submit_task_queue(destination: str) -> str:
    """Task queue of a destination's submit activities (its rate limit is the submit rate)."""
    return f"outbox-submit-{destination}"


def poll_task_queue(destination: str) -> str:
    """Task queue of a destination's poll activities (its rate limit is the poll rate)."""
    return f"outbox-poll-{destination}"


# The server refuses a longer fairness key, and the workflow task that scheduled it fails
# forever ("fairness key length exceeds limit"), so the item would never move.
MAX_FAIRNESS_KEY_BYTES = 64


def outbox_fairness_key(outbox: str) -> str:
    """The fairness key of an outbox's submits and polls: the outbox name itself, or for a name
    over 64 bytes its first 47 characters, `~` and a hash (`~` is in no outbox name)."""
    if len(outbox.encode()) <= MAX_FAIRNESS_KEY_BYTES:
        return outbox
    digest = hashlib.sha256(outbox.encode()).hexdigest()[:16]
    return f"{outbox[:47]}~{digest}"


def payload_hash(destination: str, payload: Any, ordering_key: str | None = None) -> str:
    """A canonical hash of what was asked for, to tell a retry from a conflicting reuse of a key."""
    canonical = json.dumps(
        {"destination": destination, "payload": payload, "ordering_key": ordering_key},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    # The API refuses lone surrogates, but a hash must never be what fails (in a lane's workflow
    # it would fail the task forever): they hash as themselves, every other text as its UTF-8.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
