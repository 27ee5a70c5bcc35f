"""Rotation's second half: sealed values written under an older payload key (or before keys were
set) sealed again under the current one, a page of rows at a time, and a count of the values
under each key id, which says when an old key can be removed (docs/how-to/security.md).

A new key in front seals every new value at once (`contract.sealed_columns`); the values already
stored keep their key until `reseal_page` rewrites them. Each page reads its rows' stored values
as they are (no column type applied), opens the ones not under the current key and writes them
back sealed, in one transaction that locks those rows on PostgreSQL (a projection writing the
same row meanwhile waits, then writes its own value, itself under the current key; SQLite has one
writer at a time).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_outbox_temporal.contract.reseal import ResealPageResult, RowKey
from durable_outbox_temporal.contract.sealed_columns import (
    SealedJSON,
    SealedText,
    keys_of,
    open_json,
    seal_json,
)
from durable_outbox_temporal.contract.sealing import (
    PREFIX,
    SealedValueError,
    ValueKeys,
    open_text,
    sealed_with,
)
from sqlalchemy import (
    Column,
    ColumnElement,
    Engine,
    Table,
    Text,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    tuple_,
    type_coerce,
    update,
)

from readmodel.models import DataclassList, metadata

_SEALED_TYPES = (SealedJSON, SealedText, DataclassList)


class NoPayloadKeys(ValueError):
    """Resealing needs payload keys: without them there is no key to seal under."""

    def __init__(self) -> None:
        super().__init__(
            "no payload keys are configured (PAYLOAD_KEYS or PAYLOAD_KEYS_FILE):"
            " there is no key to seal under"
        )


def sealed_columns(table: Table) -> list[Column[Any]]:
    """The columns of `table` whose values are stored sealed."""
    return [column for column in table.columns if isinstance(column.type, _SEALED_TYPES)]


def sealed_tables(extra: Iterable[Table] = ()) -> list[Table]:
    """Every table with sealed columns, in the order a batch walks them: the product's (by
    name), then `extra` (the aggregate types' projector tables)."""
    product = sorted(metadata.tables.values(), key=lambda table: table.name)
    return [table for table in [*product, *extra] if sealed_columns(table)]


def reseal_page(
    engine: Engine,
    tables: Sequence[Table],
    table_name: str | None,
    cursor: RowKey | None,
    limit: int,
) -> ResealPageResult:
    """Seal again under the current key the values of the next `limit` rows of `table_name`
    (None: the first table) after `cursor`. A value under a key not configured is left as it is
    and named in `unreadable`. Raises `NoPayloadKeys` on an engine without keys."""
    keys = keys_of(engine)
    if keys is None:
        raise NoPayloadKeys()
    names = [table.name for table in tables]
    table = tables[names.index(table_name)] if table_name is not None else tables[0]
    key_columns = list(table.primary_key.columns)
    columns = sealed_columns(table)
    query = select(*key_columns, *(_raw(column) for column in columns))
    if cursor is not None:
        query = query.where(_after(key_columns, cursor))
    query = query.order_by(*key_columns).limit(limit)
    resealed = 0
    unreadable: list[str] = []
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            query = query.with_for_update()
        rows = connection.execute(query).all()
        for row in rows:
            row_key = list(row[: len(key_columns)])
            changes: dict[str, Any] = {}
            for column, stored in zip(columns, row[len(key_columns) :], strict=True):
                if stored is None or sealed_with(stored) == keys.current:
                    continue
                try:
                    changes[column.name] = literal(
                        _sealed_again(column, stored, keys), _impl(column)
                    )
                except SealedValueError as err:
                    unreadable.append(f"{table.name}.{column.name} {row_key}: {err}")
            if changes:
                connection.execute(
                    update(table)
                    .where(*(c == value for c, value in zip(key_columns, row_key, strict=True)))
                    .values(changes)
                )
                resealed += len(changes)
    next_table: str | None = table.name
    next_cursor: RowKey | None = list(rows[-1][: len(key_columns)]) if rows else None
    if len(rows) < limit:  # the table is walked: the next one, from its start
        position = names.index(table.name) + 1
        next_table = names[position] if position < len(names) else None
        next_cursor = None
    return ResealPageResult(
        key_id=keys.current,
        table=table.name,
        resealed=resealed,
        unreadable=unreadable,
        next_table=next_table,
        next_cursor=next_cursor,
    )


@dataclass
class SealedCounts:
    """Stored values by the key id they are sealed under, and those stored plain (written
    without keys). Counts by every configured key, plus `other` for key ids not configured."""

    by_key: dict[str, int] = field(default_factory=dict)
    other: int = 0
    plain: int = 0


def sealed_counts(engine: Engine, tables: Sequence[Table], key_ids: Sequence[str]) -> SealedCounts:
    """How many stored values each of `key_ids` seals, how many are sealed under any other key
    id, and how many are plain: one scan of each sealed column."""
    counts = SealedCounts(by_key=dict.fromkeys(key_ids, 0))
    with engine.connect() as connection:
        for table in tables:
            for column in sealed_columns(table):
                stored = cast(_raw(column), Text)
                sealed = _sealed_under(stored, "")
                sums = [
                    func.coalesce(func.sum(case((_sealed_under(stored, key_id), 1), else_=0)), 0)
                    for key_id in key_ids
                ]
                row = connection.execute(
                    select(
                        func.count(stored),
                        func.coalesce(func.sum(case((sealed, 1), else_=0)), 0),
                        *sums,
                    )
                ).one()
                present, sealed_total, *per_key = (int(value) for value in row)
                counts.plain += present - sealed_total
                counts.other += sealed_total - sum(per_key)
                for key_id, count in zip(key_ids, per_key, strict=True):
                    counts.by_key[key_id] += count
    return counts


def _impl(column: Column[Any]) -> Any:
    # The stored type under the sealing one: JSON for a JSON column, text for a text one.
    return column.type.impl  # type: ignore[attr-defined]


def _raw(column: Column[Any]) -> ColumnElement[Any]:
    """The column's value as stored (sealed text, or the plain value), without opening it."""
    return type_coerce(column, _impl(column)).label(column.name)


def _sealed_again(column: Column[Any], stored: Any, keys: ValueKeys) -> Any:
    if isinstance(column.type, SealedText):
        return keys.seal(open_text(stored, keys).encode("utf-8", "surrogatepass"))
    return seal_json(open_json(stored, keys), keys)


def _after(key_columns: list[Column[Any]], cursor: RowKey) -> ColumnElement[bool]:
    if len(key_columns) == 1:
        return key_columns[0] > cursor[0]
    return tuple_(*key_columns) > tuple_(*(literal(value) for value in cursor))


def _sealed_under(stored: ColumnElement[Any], key_id: str) -> ColumnElement[bool]:
    """Whether the stored text is a sealed value under `key_id` (under any key for ""): as text
    (a text column) or as a JSON string (a JSON column holds it quoted)."""
    escaped = key_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    prefix = f"{PREFIX}{escaped}:" if key_id else PREFIX
    return or_(
        stored.like(f"{prefix}%", escape="\\"),
        stored.like(f'"{prefix}%', escape="\\"),
    )
