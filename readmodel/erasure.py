"""Erasing an ended item's personal data from the read model, leaving no copy behind.

`erase_item` removes, in one transaction: the item's payload and its digest; its recipients'
addresses (each recipient's status and time stay, its provider detail goes); every address the
payload or the recipients named, wherever the item's event details and last error quote it; its
attempts' headers and bodies (numbers, statuses and times stay); its claim-check blobs; the relay's
`outbox_pending` rows of its key; its link to the subject it was enqueued for
(`readmodel.subjects`); and its debounce window's copy in the carrier that delivered it (the
whole payload under `latest`, its entry under `collect`). The item is then marked
erased, so a redrive is refused and a late projection never brings the payload back
(`readmodel.store`). Temporal's copy is encrypted (payload codec) and goes with its retention.

An item whose row retention pruned left its key's memory (`outbox_keys`), with the digest of its
request, and its subject link: `erase_remembered_key` erases those, so an erasure a year on
reaches what is left of it. A relay row the outbox refused for good made no item at all, and
keeps its payload: `erase_refused_relay_rows` deletes those of a key.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

from durable_outbox_temporal.contract.debounce import COLLECTED_KEY
from durable_outbox_temporal.contract.ids import item_workflow_id, parse_item_workflow_id
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    ItemStatus,
    OutboxItemView,
    Recipient,
)
from sqlalchemy import Connection, Engine, delete, func, insert, literal, select, union, update

from readmodel.models import (
    EVENTS,
    ITEM_ATTEMPTS,
    ITEM_ERASURES,
    ITEM_KEYS,
    ITEM_SUBJECTS,
    ITEMS,
    OUTBOX_PENDING,
    PAYLOAD_BLOBS,
)

# The statuses an item's payload may be erased in: it has ended and will not be sent again.
ERASABLE = frozenset(
    {ItemStatus.SENT, ItemStatus.FAILED, ItemStatus.CANCELLED, ItemStatus.SUPERSEDED}
)

# What stands where an address was.
ERASED = "[erased]"
# A relay row the outbox refused for good (`outbox_pending.status`).
REFUSED = "refused"
# An address in a payload's text: enough to find what a detail could quote.
# `_erase_row`'s answer for a row retention pruned before (or while) it was erased.
_PRUNED: Literal["pruned"] = "pruned"
_ADDRESS = re.compile(r"[^\s@\"'<>(),;:]+@[^\s@\"'<>(),;:]+")


class CarrierUnderWay(Exception):
    """The debounce window's carrier holding a copy of the item's payload has not ended."""


def refusal(view: OutboxItemView, report_window_s: float, now: datetime) -> str | None:
    """Why the item's data cannot be erased now (it is under way, or a delivery report could
    still bring its recipients' addresses back); None when it can."""
    if view.status not in ERASABLE:
        return (
            f"item {view.key!r} is {view.status}: only a sent, failed, cancelled or superseded"
            " item's payload can be erased"
        )
    if view.delivery is DeliveryOutcome.PENDING and view.finished_at and report_window_s > 0:
        reports_until = view.finished_at + timedelta(seconds=report_window_s)
        if reports_until > now:
            return (
                f"item {view.key!r} takes delivery reports until {reports_until.isoformat()}: a"
                " report would bring its recipients' addresses back; erase it after that"
            )
    return None


def keys_with_prefix(
    engine: Engine, outbox: str, prefix: str, *, after: str | None, limit: int
) -> list[str]:
    """The keys of the outbox's items starting with `prefix`, in key order after `after`: those
    with a row, those whose row retention pruned (their key memory), and those of relay rows
    the outbox refused (no item)."""
    id_prefix = item_workflow_id(outbox, "")
    rows = select(ITEMS.c.key.label("key")).where(
        ITEMS.c.outbox == outbox, ITEMS.c.key.startswith(prefix, autoescape=True)
    )
    # The key memory knows an item by its id only: the key is what follows `outbox/{outbox}/`.
    remembered = select(func.substr(ITEM_KEYS.c.item_id, len(id_prefix) + 1).label("key")).where(
        ITEM_KEYS.c.item_id.startswith(id_prefix + prefix, autoescape=True)
    )
    refused = select(OUTBOX_PENDING.c.key.label("key")).where(
        OUTBOX_PENDING.c.outbox == outbox,
        OUTBOX_PENDING.c.status == REFUSED,
        OUTBOX_PENDING.c.key.startswith(prefix, autoescape=True),
    )
    if after is not None:
        rows = rows.where(ITEMS.c.key > after)
        remembered = remembered.where(ITEM_KEYS.c.item_id > literal(id_prefix + after))
        refused = refused.where(OUTBOX_PENDING.c.key > after)
    keys = union(rows, remembered, refused).subquery()
    query = select(keys.c.key).order_by(keys.c.key).limit(limit)
    with engine.connect() as connection:
        return list(connection.execute(query).scalars())


def erase_refused_relay_rows(engine: Engine, outbox: str, key: str) -> int:
    """Delete the relay rows of the key that the outbox refused for good (they made no item, and
    keep the payload the application wrote); how many went. Pending and relayed rows stay (the
    relay deletes relayed ones after `RELAY_RETENTION_S`; `erase_item` deletes them with the
    item)."""
    with engine.begin() as connection:
        gone = connection.execute(
            delete(OUTBOX_PENDING).where(
                OUTBOX_PENDING.c.outbox == outbox,
                OUTBOX_PENDING.c.key == key,
                OUTBOX_PENDING.c.status == REFUSED,
            )
        )
    return gone.rowcount


def erase_remembered_key(
    engine: Engine, item_id: str, now: datetime | None = None
) -> datetime | None:
    """Erase what is left of an item whose row retention pruned: the digest of its request in
    its key's memory (a repeat of the key is then answered by its status alone, as for an
    erased item), its subject link and the relay's rows of its key, and mark it erased. Returns
    when (the first time, on a repeat), or None when the key has no memory (no such item, or
    its row is still there: `erase_item`)."""
    now = now or datetime.now(UTC)
    outbox, key = parse_item_workflow_id(item_id)
    with engine.begin() as connection:
        found = connection.execute(
            update(ITEM_KEYS).where(ITEM_KEYS.c.item_id == item_id).values(payload_hash=ERASED)
        )
        if found.rowcount != 1:
            return None
        connection.execute(delete(ITEM_SUBJECTS).where(ITEM_SUBJECTS.c.item_id == item_id))
        connection.execute(
            delete(OUTBOX_PENDING).where(
                OUTBOX_PENDING.c.outbox == outbox, OUTBOX_PENDING.c.key == key
            )
        )
        return _mark_erased(connection, item_id, now)


def erase_item(
    engine: Engine, item_id: str, erasable: Collection[str], now: datetime | None = None
) -> datetime | None:
    """Erase the item's personal data (see the module); returns when, or None when its row's
    status is not one of `erasable` at that moment (a redrive took it meanwhile:
    `readmodel.attempts.claim_redrive`), and nothing is erased. Raises `CarrierUnderWay` when
    its window's carrier, holding a copy, is still under way. A row retention pruned before or
    while it was erased is erased through its key's memory (`erase_remembered_key`), where it
    answered "queued again"."""
    now = now or datetime.now(UTC)
    erased = _erase_row(engine, item_id, erasable, now)
    if erased == _PRUNED:
        # Retention pruned the row meanwhile: what is left of it is its key's memory.
        return erase_remembered_key(engine, item_id, now)
    assert not isinstance(erased, str)
    return erased


def _erase_row(
    engine: Engine, item_id: str, erasable: Collection[str], now: datetime
) -> datetime | Literal["pruned"] | None:
    with engine.begin() as connection:
        row = (
            connection.execute(
                select(
                    ITEMS.c.outbox,
                    ITEMS.c.key,
                    ITEMS.c.payload,
                    ITEMS.c.recipients,
                    ITEMS.c.last_error,
                    ITEMS.c.superseded_by,
                ).where(ITEMS.c.id == item_id)
            )
            .mappings()
            .first()
        )
        if row is None:
            return _PRUNED
        recipients: list[Recipient] = row["recipients"] or []
        addresses = _addresses(row["payload"], recipients)
        # One statement decides: a concurrent redrive's claim and this erase never both win.
        erased = connection.execute(
            update(ITEMS)
            .where(ITEMS.c.id == item_id, ITEMS.c.status.in_(list(erasable)))
            .values(
                payload=None,
                # The digest of what was erased would confirm a guess of it: a repeat of the key
                # is answered by its status alone (`service.items`).
                payload_hash=ERASED,
                recipients=[
                    Recipient(ERASED, recipient.status, None, recipient.at)
                    for recipient in recipients
                ],
                last_error=_redact(row["last_error"], addresses),
            )
        )
        if erased.rowcount != 1:
            kept = connection.execute(select(ITEMS.c.id).where(ITEMS.c.id == item_id)).first()
            connection.rollback()
            return None if kept is not None else _PRUNED
        _redact_events(connection, item_id, addresses)
        connection.execute(
            update(ITEM_ATTEMPTS)
            .where(ITEM_ATTEMPTS.c.item_id == item_id)
            .values(request_headers={}, response_headers={}, body=None, body_truncated=False)
        )
        connection.execute(delete(PAYLOAD_BLOBS).where(PAYLOAD_BLOBS.c.workflow_id == item_id))
        connection.execute(delete(ITEM_SUBJECTS).where(ITEM_SUBJECTS.c.item_id == item_id))
        connection.execute(
            delete(OUTBOX_PENDING).where(
                OUTBOX_PENDING.c.outbox == row["outbox"], OUTBOX_PENDING.c.key == row["key"]
            )
        )
        if row["superseded_by"] is not None and row["payload"] is not None:
            _erase_from_carrier(connection, row["superseded_by"], row["payload"], erasable, now)
        return _mark_erased(connection, item_id, now)


def _addresses(payload: Any, recipients: Iterable[Recipient]) -> set[str]:
    found = {recipient.address for recipient in recipients if recipient.address != ERASED}
    found.update(_ADDRESS.findall(" ".join(_strings(payload))))
    return found


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _redact(text: str | None, addresses: set[str]) -> str | None:
    if text is None or not addresses:
        return text
    pattern = "|".join(re.escape(address) for address in sorted(addresses, key=len, reverse=True))
    return re.sub(pattern, ERASED, text, flags=re.IGNORECASE)


def _redact_events(connection: Connection, item_id: str, addresses: set[str]) -> None:
    details = connection.execute(
        select(EVENTS.c.id, EVENTS.c.detail).where(
            EVENTS.c.item_id == item_id, EVENTS.c.detail.is_not(None)
        )
    ).all()
    for event_id, detail in details:
        redacted = _redact(detail, addresses)
        if redacted != detail:
            connection.execute(
                update(EVENTS).where(EVENTS.c.id == event_id).values(detail=redacted)
            )


def _erase_from_carrier(
    connection: Connection,
    carrier_id: str,
    payload: dict[str, Any],
    erasable: Collection[str],
    now: datetime,
) -> None:
    """Remove the member's copy from the carrier that delivered its window: the carrier's
    whole payload when it is that copy (`latest`), else the copy's entry (`collect`)."""
    carrier = (
        connection.execute(select(ITEMS.c.status, ITEMS.c.payload).where(ITEMS.c.id == carrier_id))
        .mappings()
        .first()
    )
    if carrier is None or carrier["payload"] is None:
        return
    carried: dict[str, Any] = carrier["payload"]
    collected = carried.get(COLLECTED_KEY) if len(carried) == 1 else None
    if carried != payload and not (isinstance(collected, list) and payload in collected):
        return
    if carrier["status"] not in erasable:
        raise CarrierUnderWay(
            f"its debounce window's carrier {carrier_id!r} holds a copy of its payload and is"
            f" {carrier['status']}: erase it once the carrier has ended"
        )
    if carried == payload:
        connection.execute(update(ITEMS).where(ITEMS.c.id == carrier_id).values(payload=None))
        _mark_erased(connection, carrier_id, now)
        return
    assert isinstance(collected, list)
    kept = [entry for entry in collected if entry != payload]
    connection.execute(
        update(ITEMS).where(ITEMS.c.id == carrier_id).values(payload={COLLECTED_KEY: kept})
    )


def _mark_erased(connection: Connection, item_id: str, now: datetime) -> datetime:
    found = connection.execute(
        select(ITEM_ERASURES.c.erased_at).where(ITEM_ERASURES.c.item_id == item_id)
    ).scalar_one_or_none()
    if found is not None:
        return cast(datetime, found)
    connection.execute(insert(ITEM_ERASURES).values(item_id=item_id, erased_at=now))
    return now
