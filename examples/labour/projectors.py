"""`labour_history`: per mother, her labours with status and counts (a cross-aggregate read
model). Reads the `labour` aggregates' events by their JSON; an event at
or below a row's `last_seq` is skipped, so the row never goes backwards.

Its table is the example's own (`labour_metadata`), made by the example's migrations
(`examples/labour/migrations/`), not the product's. The mother's name and the subscribers are
sealed under the payload keys; erasing a labour's data removes its row (`forget`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.aggregate import MAX_AGGREGATE_ID_LENGTH
from durable_outbox_temporal.contract.outbox_pending import UTCDateTime
from durable_outbox_temporal.contract.sealed_columns import SealedJSON, SealedText
from sqlalchemy import Column, Connection, Index, Integer, MetaData, String, Table, select

from readmodel.projectors.base import AsyncProjector, StoredEvent

labour_metadata = MetaData()

# Per labour, for its mother's history.
LABOUR_HISTORY = Table(
    "labour_history",
    labour_metadata,
    Column("labour_id", String(MAX_AGGREGATE_ID_LENGTH), primary_key=True),
    Column("mother", String(64), nullable=False),
    # A caller's data: sealed under the payload keys, like `subscribers` below.
    Column("mother_name", SealedText(), nullable=False),
    Column("status", String(16), nullable=False),
    Column("contractions", Integer(), nullable=False),
    Column("updates", Integer(), nullable=False),
    Column("announcements", Integer(), nullable=False),
    # Approved subscribers' ids, sorted: a re-approval or a removal never double counts. Sealed
    # under the payload keys, as the product's own columns of a caller's data are.
    Column("subscribers", SealedJSON(), nullable=False),
    Column("planned_at", UTCDateTime(), nullable=False),
    Column("completed_at", UTCDateTime(), nullable=True),
    Column("last_seq", Integer(), nullable=False),
    Index("ix_labour_history_mother", "mother", "labour_id"),
)


def apply(connection: Connection, event: StoredEvent) -> None:
    table = LABOUR_HISTORY
    row = (
        connection.execute(select(table).where(table.c.labour_id == event.aggregate_id))
        .mappings()
        .first()
    )
    if row is not None and event.seq <= row["last_seq"]:
        return
    data = event.data
    if event.type == "LabourPlanned":
        if row is None:
            connection.execute(
                table.insert().values(
                    labour_id=event.aggregate_id,
                    mother=data["mother"],
                    mother_name=data["mother_name"],
                    status="planned",
                    contractions=0,
                    updates=0,
                    announcements=0,
                    subscribers=[],
                    planned_at=event.recorded_at,
                    last_seq=event.seq,
                )
            )
        return
    if row is None:
        return  # nothing comes before LabourPlanned: decide refuses it
    changes: dict[str, Any] = {"last_seq": event.seq}
    subscribers = set(row["subscribers"])
    match event.type:
        case "ContractionStarted":
            changes["contractions"] = row["contractions"] + 1
        case "UpdatePosted":
            changes["updates"] = row["updates"] + 1
            if data.get("kind") == "announcement":
                changes["announcements"] = row["announcements"] + 1
        case "SubscriberApproved":
            changes["subscribers"] = sorted(subscribers | {data["subscriber"]})
        case "SubscriberRemoved":
            changes["subscribers"] = sorted(subscribers - {data["subscriber"]})
        case "LabourCompleted":
            changes["status"] = "completed"
            changes["completed_at"] = datetime.fromisoformat(data["at"])
    connection.execute(
        table.update().where(table.c.labour_id == event.aggregate_id).values(**changes)
    )


def forget(connection: Connection, aggregate_type: str, labour_id: str) -> None:
    """An erased labour leaves its mother's history: its row is all about it."""
    connection.execute(LABOUR_HISTORY.delete().where(LABOUR_HISTORY.c.labour_id == labour_id))


LABOUR_HISTORY_PROJECTOR = AsyncProjector(
    name="labour_history",
    aggregate_types=frozenset({"labour"}),
    apply=apply,
    table=LABOUR_HISTORY,
    filters={"mother": LABOUR_HISTORY.c.mother, "status": LABOUR_HISTORY.c.status},
    forget=forget,
)
