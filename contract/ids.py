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


def item_workflow_id(outbox: str, key: str) -> str:
    """The one workflow id of an item: `outbox/{outbox}/{key}`."""
    return f"outbox/{outbox}/{key}"


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


def payload_hash(destination: str, payload: Any, ordering_key: str | None = None) -> str:
    """A canonical hash of what was asked for, to tell a retry from a conflicting reuse of a key."""
    canonical = json.dumps(
        {"destination": destination, "payload": payload, "ordering_key": ordering_key},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
