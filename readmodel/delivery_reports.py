"""A delivery report that arrives after its item's report window: recorded in the read model.

Within the window a report is signalled to the workflow holding the item, which applies it and
projects the result (`service/reports.py`). Once the window is over the item is no longer held
(its workflow ended, or its shard let it go), and nothing would apply the report: a bounce that
the provider reports after the window never reached the item. `record_late_report` applies it to
the item's row here instead, with the merge rule the workflow uses (`apply_delivery_report`: the
newest report wins, so any order of arrival ends in the same state), and adds the
`delivery-report` event the workflow would have.

Only a `sent` item's row takes one: no run writes to it any more, as a sent item is never
redriven (`service/items.py`), so the event's `seq` (the row's newest plus one) cannot meet a
run's. A failed item's (a provider's operation that failed) would race a redrive for that `seq`:
its late reports are counted and left, as its workflow left them while it ran. An erased item's
(`readmodel/erasure.py`) takes none: its recipients' addresses are gone, and a report must not
bring one back.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from durable_outbox_temporal.contract.ids import parse_item_workflow_id
from durable_outbox_temporal.contract.item import (
    DeliveryReport,
    ItemEvent,
    ItemEventType,
    ItemStatus,
    Recipient,
    apply_delivery_report,
    delivery_outcome,
    report_event_detail,
)
from sqlalchemy import Engine, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.db import lock_scopes
from readmodel.erasure import ERASED
from readmodel.models import EVENTS, ITEM_ERASURES, ITEMS
from readmodel.store import field_values


def record_late_report(
    engine: Engine, destination: str | None, item_id: str, report: DeliveryReport, now: datetime
) -> bool:
    """Apply `report` to the `sent` item's row and add its `delivery-report` event, in one
    transaction; True when it changed a recipient. False, writing nothing, when it changes
    nothing (a repeat, or older than what the recipient shows), or when the item is not a sent
    item (of `destination`, unless None) holding the report's message, names no such recipient,
    or was erased."""
    with engine.begin() as connection:
        # One late report of an item at a time (SQLite: the write lock, taken before the read).
        lock_scopes(connection, [f"late-report/{item_id}"])
        if connection.dialect.name == "postgresql":
            # The outbox's event ids commit in order, as `store.apply_projections` keeps them;
            # taken before the row, in its order.
            outbox, _ = parse_item_workflow_id(item_id)
            connection.execute(
                text("SELECT pg_advisory_xact_lock(hashtext(:outbox))"), {"outbox": outbox}
            )
        row = (
            connection.execute(
                select(
                    ITEMS.c.outbox,
                    ITEMS.c.status,
                    ITEMS.c.destination,
                    ITEMS.c.provider_message_id,
                    ITEMS.c.recipients,
                    ITEMS.c.last_event_seq,
                )
                .where(ITEMS.c.id == item_id)
                # PostgreSQL: an erase of the item waits for this transaction, or this one for
                # it, and then reads the recipients it left.
                .with_for_update()
            )
            .mappings()
            .first()
        )
        if (
            row is None
            or row["status"] != ItemStatus.SENT.value
            or destination not in (None, row["destination"])
            or row["provider_message_id"] != report.message_id
        ):
            return False
        erased = select(ITEM_ERASURES.c.item_id).where(ITEM_ERASURES.c.item_id == item_id)
        if connection.execute(erased).first() is not None:
            return False
        recipients: list[Recipient] = [dataclasses.replace(r) for r in row["recipients"] or ()]
        address = report.recipient.casefold()
        if not any(r.address.casefold() == address and r.address != ERASED for r in recipients):
            return False  # apply_delivery_report would add it: a report names only its own
        changed = apply_delivery_report(recipients, report)
        if changed is None:
            return False
        seq = row["last_event_seq"] + 1
        event = ItemEvent(
            seq=seq,
            type=ItemEventType.DELIVERY_REPORT,
            status=ItemStatus.SENT,
            at=now,
            detail=report_event_detail(changed),
        )
        insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
        added = connection.execute(
            insert(EVENTS)
            .on_conflict_do_nothing(index_elements=["item_id", "seq"])
            .returning(EVENTS.c.id),
            {**field_values(event), "item_id": item_id, "outbox": row["outbox"]},
        ).first()
        if added is None:
            connection.rollback()  # a run's event holds the seq: the item is not ours to write
            return False
        connection.execute(
            update(ITEMS)
            .where(ITEMS.c.id == item_id, ITEMS.c.last_event_seq == row["last_event_seq"])
            .values(
                recipients=recipients,
                delivery=delivery_outcome(recipients),
                last_event_seq=seq,
                updated_at=now,
            )
        )
        return True
