"""The transactional outbox: enqueue in the application's own database transaction.

An application that writes its own rows and then calls another system can lose the call when it
dies in between (the dual-write problem). `enqueue_in` inserts an `outbox_pending` row
through the caller's SQLAlchemy session or connection instead, so the item commits or rolls back
with the caller's business rows; a relay (`service.relay`, in the worker by default) then enqueues
each committed row under its key, so a repeated relay is the same item, never a second one.

The row's payload is sealed under the stack's payload keys (`contract.sealing`): the ones given,
else those `PAYLOAD_KEYS` / `PAYLOAD_KEYS_FILE` name in this process's environment, as `connect`
reads them for Temporal's codec. With neither, it is stored plain, and the relay reads either.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert, text
from sqlalchemy.orm import Session

from durable_outbox_temporal.codec import EncryptionCodec, codec_from_environment
from durable_outbox_temporal.contract.outbox_pending import OUTBOX_PENDING_TABLE
from durable_outbox_temporal.contract.sealed_columns import seal_json
from durable_outbox_temporal.contract.sealing import ValueKeys
from durable_outbox_temporal.errors import InvalidRequest
from durable_outbox_temporal.validation import validate_new_item

# PostgreSQL's notification channel: a NOTIFY is delivered when (and only if) the transaction
# commits, so a listening relay wakes for committed rows only.
NOTIFY_CHANNEL = "outbox_pending"


def enqueue_in(
    session: Session | Connection,
    *,
    outbox: str,
    destination: str,
    payload: dict[str, Any],
    key: str | None = None,
    ordering_key: str | None = None,
    not_before: datetime | None = None,
    max_attempts: int | None = None,
    keys: EncryptionCodec | None = None,
) -> str:
    """Add an item to `outbox` in the caller's transaction; its key (a fresh UUID if None).

    Nothing is sent until the transaction commits and the relay picks the row up; a rollback
    leaves nothing behind. The same checks as `OutboxClient.enqueue` apply here, at once, except
    the destination's existence (the relay's configuration decides it: a row for an unknown one
    is marked `refused`, with the reason). The payload is stored sealed under `keys` (default:
    the environment's `PAYLOAD_KEYS`; none: plain).
    """
    key = key if key is not None else str(uuid.uuid4())
    now = datetime.now(UTC)
    validate_new_item(
        outbox,
        key,
        ordering_key=ordering_key,
        not_before=not_before,
        max_attempts=max_attempts,
        now=now,
        payload=payload,
    )
    if not destination:
        raise InvalidRequest("destination is required")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as err:
        raise InvalidRequest(f"payload is not JSON: {err}") from err
    session.execute(
        insert(OUTBOX_PENDING_TABLE).values(
            outbox=outbox,
            key=key,
            destination=destination,
            payload=seal_json(payload, _value_keys(keys)),
            ordering_key=ordering_key,
            not_before=not_before,
            max_attempts=max_attempts,
            created_at=now,
            status="pending",
            attempts=0,
        )
    )
    bind = session.get_bind() if isinstance(session, Session) else session
    if bind.dialect.name == "postgresql":
        session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))
    return key


def _value_keys(keys: EncryptionCodec | None) -> ValueKeys | None:
    if keys is not None:
        return keys.value_keys()
    return _environment_keys(
        os.environ.get("PAYLOAD_KEYS", ""), os.environ.get("PAYLOAD_KEYS_FILE", "")
    )


@functools.lru_cache(maxsize=4)
def _environment_keys(setting: str, path: str) -> ValueKeys | None:
    # Read once per setting: an enqueue in the application's transaction reads no file.
    codec = codec_from_environment({"PAYLOAD_KEYS": setting, "PAYLOAD_KEYS_FILE": path})
    return None if codec is None else codec.value_keys()
