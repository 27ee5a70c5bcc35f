"""Read-model tables, derived from the contract's dataclasses rather than written out again.

`outbox_items` has one column per field of `OutboxItemView` (plus the payload); `outbox_events`
one per field of `ItemEvent` (plus its item, outbox and cursor). A field added to the view
becomes a column here; an Alembic migration (`readmodel/migrations`) brings existing databases
along, and a test checks that the migrations and these tables agree.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from durable_outbox_temporal.contract.aggregate import (
    MAX_AGGREGATE_ID_LENGTH,
    MAX_AGGREGATE_TYPE_LENGTH,
    RecordedEvent,
)
from durable_outbox_temporal.contract.item import MAX_LENGTH, ItemEvent, OutboxItemView
from durable_outbox_temporal.contract.lane import LaneView
from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_ITEM_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
)
from durable_outbox_temporal.contract.outbox_pending import OUTBOX_PENDING_TABLE, UTCDateTime
from durable_outbox_temporal.contract.sealed_columns import (
    SealedJSON,
    SealedText,
    keys_of,
    open_json,
    seal_json,
)
from pydantic import TypeAdapter
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.types import TypeDecorator, TypeEngine

metadata = MetaData()

T = TypeVar("T")


class DataclassList(TypeDecorator[list[Any]]):
    """A list of dataclasses (e.g. an item's recipients) stored as JSON, read back as objects;
    sealed under the engine's payload keys (`contract.sealed_columns`)."""

    impl = JSON()
    cache_ok = True

    def __init__(self, item_type: type[Any]) -> None:
        super().__init__()
        self.item_type = item_type
        self._adapter: TypeAdapter[list[Any]] = TypeAdapter(list[item_type])  # type: ignore[valid-type]

    def process_bind_param(self, value: list[Any] | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        # Dicts (from `dataclasses.asdict`) or objects alike; datetimes become ISO text.
        plain = self._adapter.dump_python(self._adapter.validate_python(value), mode="json")
        return seal_json(plain, keys_of(dialect))

    def process_result_value(self, value: Any, dialect: Dialect) -> list[Any] | None:
        if value is None:
            return None
        return self._adapter.validate_python(open_json(value, keys_of(dialect)))


def sealed_text(name: str, nullable: bool = True) -> Column[str]:
    """A text column of a caller's data, stored sealed under the engine's payload keys."""
    return Column(name, SealedText(), nullable=nullable)


def dataclass_columns(
    cls: type[Any], overrides: Mapping[str, Column[Any]] | None = None
) -> list[Column[Any]]:
    """One column per field of `cls`: typed from its annotation, NULL only where it is Optional,
    sized by the field's `max_length`; `overrides` replaces the derived column of a field."""
    overrides = overrides or {}
    hints = get_type_hints(cls)
    columns: list[Column[Any]] = []
    for field in dataclasses.fields(cls):
        if field.name in overrides:
            columns.append(overrides[field.name])
            continue
        python_type, optional = _unwrap_optional(hints[field.name])
        sql_type = _sql_type(python_type, field.metadata.get(MAX_LENGTH))
        columns.append(Column(field.name, sql_type, nullable=optional))
    return columns


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (Union, types.UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return members[0], len(members) < len(get_args(hint))
    return hint, False


def _sql_type(python_type: Any, max_length: int | None) -> TypeEngine[Any]:
    # bool before int: a bool is an int to issubclass.
    if python_type is bool:
        return Boolean()
    if python_type is int:
        return Integer()
    if python_type is float:
        return Float()
    if python_type is datetime:
        return UTCDateTime()
    if isinstance(python_type, type) and issubclass(python_type, str):  # str and StrEnums
        return String(max_length)
    if get_origin(python_type) is list and dataclasses.is_dataclass(get_args(python_type)[0]):
        return DataclassList(get_args(python_type)[0])
    raise TypeError(f"no column type for a field of type {python_type!r}")


def record_reader(cls: type[T]) -> Callable[[RowMapping], T]:
    """A function building `cls` from a row holding a column per field (enums re-typed)."""
    hints = get_type_hints(cls)
    names = [field.name for field in dataclasses.fields(cast(Any, cls))]
    enums = {
        name: python_type
        for name in names
        if isinstance(python_type := _unwrap_optional(hints[name])[0], type)
        and issubclass(python_type, enum.Enum)
    }

    def read(row: RowMapping) -> T:
        values = {name: row[name] for name in names}
        for name, enum_type in enums.items():
            if values[name] is not None:
                values[name] = enum_type(values[name])
        return cls(**values)

    return read


def cursor_column() -> Column[int]:
    """An event table's `id`: a cursor that only grows. BigInteger on PostgreSQL, but SQLite
    only auto-increments an INTEGER PRIMARY KEY."""
    return Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )


ITEMS = Table(
    "outbox_items",
    metadata,
    *dataclass_columns(
        OutboxItemView,
        overrides={
            "id": Column("id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
            # Never NULL in the table: it is the keyset the item lists page on.
            "created_at": Column("created_at", UTCDateTime(), nullable=False),
            # A provider's error text may name a recipient.
            "last_error": sealed_text("last_error"),
            # A digest of a caller's payload confirms a guessed low-entropy one (a fixed text to a
            # phone number): sealed like the payload (docs/decisions/payload-digest-sealed.md).
            "payload_hash": sealed_text("payload_hash"),
        },
    ),
    # none_as_null: a projection without payload must be SQL NULL so COALESCE keeps the stored one.
    Column("payload", SealedJSON(none_as_null=True), nullable=True),
    # When retention pruned the payload and attempt bodies (`readmodel/retention.py`).
    Column("payload_pruned_at", UTCDateTime(), nullable=True),
    Index("ix_outbox_items_outbox_created", "outbox", "created_at", "id"),
    Index("ix_outbox_items_outbox_status", "outbox", "status", "created_at", "id"),
    Index("ix_outbox_items_outbox_destination", "outbox", "destination", "created_at"),
    Index("ix_outbox_items_outbox_delivery", "outbox", "delivery", "created_at", "id"),
    # The dead-letter view: an outbox's failed items by when they failed.
    Index("ix_outbox_items_outbox_status_finished", "outbox", "status", "finished_at", "id"),
    # The dashboard's health strip: a destination's items ended per minute
    # (`readmodel/activity.py`).
    Index("ix_outbox_items_destination_status_finished", "destination", "status", "finished_at"),
    # Delivery reports name only the provider's message id: this finds their item.
    Index("ix_outbox_items_provider_message_id", "provider_message_id"),
    # Retention: a destination's ended items, oldest first, a page after the last
    # (`readmodel/retention.py`, migration 0022).
    Index(
        "ix_outbox_items_destination_finished",
        "destination",
        "finished_at",
        "id",
        postgresql_where=text("finished_at IS NOT NULL"),
        sqlite_where=text("finished_at IS NOT NULL"),
    ),
)

# Bulk mode's routes (`readmodel/routes.py`): the shard count each owner (an ordering lane's id,
# or an unordered item's) was first handed over by. Every later hand-over of the owner goes by
# it, so a change of `shards` moves only owners first seen after it.
BULK_ROUTES = Table(
    "bulk_routes",
    metadata,
    Column("destination", String(MAX_DESTINATION_LENGTH), primary_key=True),
    Column("owner", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("shards", Integer(), nullable=False),
    # The last hand-over's time: retention drops a lane's route only once the lane has been idle
    # since before it (a hand-over on its way has just moved it on).
    Column("claimed_at", UTCDateTime(), nullable=False),
)

# The key memory of items whose rows retention deleted (`readmodel/retention.py`): what answers a
# repeat of the key (its status, and the digest a repeat must match), so it is never sent again.
ITEM_KEYS = Table(
    "outbox_keys",
    metadata,
    Column("item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("status", String(16), nullable=False),
    sealed_text("payload_hash"),
    Column("finished_at", UTCDateTime(), nullable=True),
    Column("pruned_at", UTCDateTime(), nullable=False),
)

EVENTS = Table(
    "outbox_events",
    metadata,
    # The outbox-wide cursor live clients resume from (`?since=`).
    cursor_column(),
    Column("item_id", String(MAX_ITEM_ID_LENGTH), nullable=False),
    Column("outbox", String(MAX_OUTBOX_LENGTH), nullable=False),
    # A detail may name a recipient ("grace@example.com: delivered") or quote a caller.
    *dataclass_columns(ItemEvent, overrides={"detail": sealed_text("detail")}),
    UniqueConstraint("item_id", "seq", name="uq_outbox_events_item_seq"),
    Index("ix_outbox_events_outbox_id", "outbox", "id"),
    # Without AUTOINCREMENT SQLite would reuse the id of a deleted newest row, and a tailer
    # already past that id would never see the new event.
    sqlite_autoincrement=True,
)


AGGREGATE_EVENTS = Table(
    "aggregate_events",
    metadata,
    # A cursor over every aggregate's events, for tailers that follow more than one.
    cursor_column(),
    Column("aggregate_type", String(MAX_AGGREGATE_TYPE_LENGTH), nullable=False),
    Column("aggregate_id", String(MAX_AGGREGATE_ID_LENGTH), nullable=False),
    *dataclass_columns(
        RecordedEvent,
        overrides={"data": Column("data", SealedJSON(), nullable=False)},
    ),
    UniqueConstraint("aggregate_type", "aggregate_id", "seq", name="uq_aggregate_events_seq"),
    sqlite_autoincrement=True,
)

AGGREGATES = Table(
    "aggregates",
    metadata,
    Column("type", String(MAX_AGGREGATE_TYPE_LENGTH), primary_key=True),
    Column("id", String(MAX_AGGREGATE_ID_LENGTH), primary_key=True),
    # The newest event's seq: the row only ever moves forward in it.
    Column("version", Integer(), nullable=False),
    Column("state", SealedJSON(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    # What its last run carried as it ended idle (passivation), sealed like the state; the
    # next run starts from it (`readmodel.aggregates.resume`).
    Column("carry", SealedJSON(none_as_null=True), nullable=True),
    Column("passivated_at", UTCDateTime(), nullable=True),
)

LANES = Table(
    "outbox_lanes",
    metadata,
    *dataclass_columns(
        LaneView,
        overrides={
            "id": Column("id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
            # Microseconds since the epoch at the lane's (re)start, plus its changes.
            "version": Column("version", BigInteger(), nullable=False),
        },
    ),
    Index("ix_outbox_lanes_outbox_key", "outbox", "ordering_key"),
    Index("ix_outbox_lanes_outbox_status", "outbox", "status"),
    # Retention's pages of idle lanes, oldest first (`readmodel.retention.prune_idle_lanes`).
    Index(
        "ix_outbox_lanes_idle",
        "updated_at",
        "id",
        postgresql_where=text("status = 'idle'"),
        sqlite_where=text("status = 'idle'"),
    ),
)

# Dead letters an operator discarded: given up on, kept for audit. A discard holds for the
# failure it was made on (`last_event_seq`); once redriven and failed again, it is a new one.
DISCARDS = Table(
    "outbox_discards",
    metadata,
    Column("item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("outbox", String(MAX_OUTBOX_LENGTH), nullable=False),
    Column("last_event_seq", Integer(), nullable=False),
    Column("reason", String(), nullable=False),
    Column("discarded_at", UTCDateTime(), nullable=False),
)


# One row per async projector (`readmodel/projectors/base.py`): how far into `aggregate_events` it
# has projected, and whether it is healthy.
PROJECTOR_CHECKPOINTS = Table(
    "projector_checkpoints",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("position", BigInteger(), nullable=False),
    Column("status", String(16), nullable=False),
    Column("consecutive_failures", Integer(), nullable=False),
    Column("last_error", String(), nullable=True),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("rebuilt_at", UTCDateTime(), nullable=True),
)

# Temporal's default limit on a workflow id's length.
MAX_WORKFLOW_ID_LENGTH = 1000

# Claim checks: payloads above the threshold, stored once by the digest of their (encrypted)
# bytes; the workflow history carries a reference (`readmodel/payload_store.py`).
PAYLOAD_BLOBS = Table(
    "payload_blobs",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("data", LargeBinary(), nullable=False),
    Column("size", Integer(), nullable=False),
    Column("stored_at", UTCDateTime(), nullable=False),
    # The workflow it was stored for, while it is the only one known to use it (a blob two
    # workflows share, or stored for an activity, has none and is never pruned).
    Column("workflow_id", String(MAX_WORKFLOW_ID_LENGTH), nullable=True),
    Index("ix_payload_blobs_workflow", "workflow_id", "stored_at"),
)

# The transactional outbox's table, shared with the applications that write it
# (`durable_outbox_temporal.contract.outbox_pending`), relayed to Temporal by `service.relay`.
OUTBOX_PENDING = OUTBOX_PENDING_TABLE.to_metadata(metadata)

# Flow control's fleet-wide counts (`readmodel.permits`): concurrency permits held, each until
# its holder returns it or its lease ends, and the requests of the last window per scope.
MAX_SCOPE_LENGTH = 255
FLOW_PERMITS = Table(
    "flow_permits",
    metadata,
    Column("scope", String(MAX_SCOPE_LENGTH), primary_key=True),
    Column("holder", String(MAX_SCOPE_LENGTH), primary_key=True),
    Column("expires_at", UTCDateTime(), nullable=False),
)
FLOW_REQUESTS = Table(
    "flow_requests",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("scope", String(MAX_SCOPE_LENGTH), nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Index("ix_flow_requests_scope_at", "scope", "at"),
)
# Flow-control rules changed at run time (`readmodel.flow_overrides`): one row per destination
# and field of its `FlowPolicy`, the value as JSON; the destinations file holds the rest.
FLOW_OVERRIDES = Table(
    "flow_overrides",
    metadata,
    Column("destination", String(MAX_DESTINATION_LENGTH), primary_key=True),
    Column("field", String(64), primary_key=True),
    Column("value", JSON(), nullable=False),
    Column("changed_at", UTCDateTime(), nullable=False),
)


@dataclass
class ItemRecord:
    """An item as the read model holds it: its view and the payload it was enqueued with."""

    view: OutboxItemView
    payload: dict[str, Any] | None
    # When retention pruned its payload and attempt bodies; None while they are kept.
    payload_pruned_at: datetime | None = None


@dataclass(kw_only=True)
class EventRecord(ItemEvent):
    """One stored event: the item's event, the item and outbox it belongs to, and its cursor."""

    id: int
    item_id: str
    outbox: str


read_view = record_reader(OutboxItemView)
read_lane = record_reader(LaneView)
read_aggregate_event = record_reader(RecordedEvent)
read_event = record_reader(EventRecord)

# The attempt log (`readmodel/attempts.py`): each request an item's activities made to its
# provider, numbered per item; the newest few are kept.
ITEM_ATTEMPTS = Table(
    "item_attempts",
    metadata,
    Column("item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("n", Integer(), primary_key=True, autoincrement=False),
    Column("kind", String(16), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("latency_ms", Integer(), nullable=False),
    Column("method", String(16), nullable=False),
    Column("host", String(255), nullable=False),
    Column("path", String(2048), nullable=False),
    Column("request_headers", SealedJSON(), nullable=False),
    Column("status", Integer(), nullable=True),
    Column("response_headers", SealedJSON(), nullable=False),
    Column("body", SealedText(), nullable=True),
    Column("body_truncated", Boolean(), nullable=False),
    Column("error", String(255), nullable=True),
)

# Items whose payload and attempt bodies were erased (`DELETE .../items/{key}/payload`).
ITEM_ERASURES = Table(
    "item_erasures",
    metadata,
    Column("item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("erased_at", UTCDateTime(), nullable=False),
)

# A subject identifier the caller attached to an item at enqueue, as a keyed digest
# (`readmodel.subjects`): the erasure batch finds a subject's items by it; nobody reads it back.
ITEM_SUBJECTS = Table(
    "item_subjects",
    metadata,
    Column("item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("outbox", String(MAX_OUTBOX_LENGTH), nullable=False),
    Column("key", String(MAX_KEY_LENGTH), nullable=False),
    Column("subject_digest", String(64), nullable=False),
    Index("ix_item_subjects_subject", "outbox", "subject_digest", "key"),
)

# Data keys (`readmodel.data_keys`): one AES-256 key per scope and generation, itself sealed
# under the payload keys. Deleting one (`key` NULL, `shredded_at` set) erases every value sealed
# under it: crypto-shredding (docs/decisions/aggregate-crypto-shredding.md).
DATA_KEYS = Table(
    "data_keys",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("scope", String(MAX_WORKFLOW_ID_LENGTH), nullable=False),
    Column("generation", Integer(), nullable=False),
    Column("key", SealedText(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("shredded_at", UTCDateTime(), nullable=True),
    UniqueConstraint("scope", "generation", name="uq_data_keys_scope_generation"),
    # A shredded key's id is never reused: a value naming it stays shredded.
    sqlite_autoincrement=True,
)

# Replayed items and their originals (`readmodel/replays.py`): the new item's `replay_of` and
# the original's list of replays, both ways by index.
ITEM_REPLAYS = Table(
    "item_replays",
    metadata,
    Column("replay_item_id", String(MAX_ITEM_ID_LENGTH), primary_key=True),
    Column("original_item_id", String(MAX_ITEM_ID_LENGTH), nullable=False),
    Column("outbox", String(MAX_OUTBOX_LENGTH), nullable=False),
    Column("replay_id", String(32), nullable=False),
    Column("original_key", String(MAX_KEY_LENGTH), nullable=False),
    Column("replay_key", String(MAX_KEY_LENGTH), nullable=False),
    Column("destination", String(MAX_DESTINATION_LENGTH), nullable=False),
    Column("replayed_at", UTCDateTime(), nullable=False),
    Index("ix_item_replays_original", "original_item_id", "replayed_at"),
)
