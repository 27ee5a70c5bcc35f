"""Retention in the read model: ended items' payloads and attempt bodies pruned, then their rows,
a page at a time, the key memory kept (`outbox_keys`).

Only ended items are touched (`sent`, `failed`, `cancelled`, `superseded`), and each statement
says so again, so an item redriven between the page's read and its write is left alone (the
redrive's claim, `readmodel.attempts.claim_redrive`, refuses a pruned item in one statement
likewise). A page is one transaction; PostgreSQL locks its rows for it. Pages take the oldest
first, each after the last item of the one before (`PruneCursor`: an index range scan over
`(destination, finished_at, id)`, never a scan past what earlier pages pruned), and find their
items by what is not pruned yet, so a page retried, or a run stopped and started again, goes on
where it was (docs/decisions/retention-pages.md).

Ordering lanes' rows (`outbox_lanes`) go too, once a lane has been idle longer than the longest
item retention (`prune_idle_lanes`): every ordering key ever used left one, for good. Bulk
routes go with their owner's row, and the run's last page of lanes takes those left without one
past the same cutoff (a hand-over that failed after its claim).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.lane import LaneStatus
from durable_outbox_temporal.contract.outbox_pending import UTCDateTime
from durable_outbox_temporal.contract.retention import PruneCursor, PrunePageResult, RetentionRule
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Select,
    and_,
    delete,
    exists,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import (
    BULK_ROUTES,
    DISCARDS,
    EVENTS,
    ITEM_ATTEMPTS,
    ITEM_ERASURES,
    ITEM_KEYS,
    ITEM_REPLAYS,
    ITEMS,
    LANES,
    PAYLOAD_BLOBS,
)

ENDED = [status.value for status in ItemStatus if status.is_final]


def prune_payloads(
    engine: Engine,
    rule: RetentionRule,
    ended_before: datetime,
    limit: int,
    now: datetime | None = None,
    after: PruneCursor | None = None,
) -> PrunePageResult:
    """Remove the payload, attempt headers and bodies and claim-check blobs of up to `limit`
    ended items of the rule that ended before `ended_before`, oldest first after `after`."""
    now = now or datetime.now(UTC)
    query = _selected(ITEMS.c.payload_pruned_at.is_(None), rule, ended_before, limit, after)
    with engine.begin() as connection:
        page = _locked(connection, query)
        ids = [row.id for row in page]
        if not ids:
            return PrunePageResult(pruned=0, more=False, last=after)
        connection.execute(
            update(ITEMS)
            .where(ITEMS.c.id.in_(ids), ITEMS.c.status.in_(ENDED))
            .values(payload=None, payload_pruned_at=now)
        )
        connection.execute(
            update(ITEM_ATTEMPTS)
            .where(ITEM_ATTEMPTS.c.item_id.in_(ids))
            .values(request_headers={}, response_headers={}, body=None, body_truncated=False)
        )
        connection.execute(delete(PAYLOAD_BLOBS).where(PAYLOAD_BLOBS.c.workflow_id.in_(ids)))
    return _page(page, limit)


def prune_rows(
    engine: Engine,
    rule: RetentionRule,
    ended_before: datetime,
    limit: int,
    now: datetime | None = None,
    after: PruneCursor | None = None,
) -> PrunePageResult:
    """Delete up to `limit` ended items of the rule that ended before `ended_before` (their
    rows, events, attempts, erasure and discard marks, blobs), oldest first after `after`,
    keeping each key's memory."""
    now = now or datetime.now(UTC)
    query = _selected(None, rule, ended_before, limit, after)
    with engine.begin() as connection:
        page = _locked(connection, query)
        ids = [row.id for row in page]
        if not ids:
            return PrunePageResult(pruned=0, more=False, last=after)
        gone = list(
            connection.execute(
                select(ITEMS.c.id).where(ITEMS.c.id.in_(ids), ITEMS.c.status.in_(ENDED))
            ).scalars()
        )
        if not gone:
            return _page(page, limit, pruned=0)
        connection.execute(_remember(engine.dialect.name, gone, now))
        for table, column in (
            (EVENTS, EVENTS.c.item_id),
            (ITEM_ATTEMPTS, ITEM_ATTEMPTS.c.item_id),
            (ITEM_ERASURES, ITEM_ERASURES.c.item_id),
            (DISCARDS, DISCARDS.c.item_id),
            (PAYLOAD_BLOBS, PAYLOAD_BLOBS.c.workflow_id),
            # A replay's link to its original goes with the replay's row (the later of the two).
            (ITEM_REPLAYS, ITEM_REPLAYS.c.replay_item_id),
        ):
            connection.execute(delete(table).where(column.in_(gone)))
        # A bulk item's route: a repeat of its key is answered by its key's memory from now on.
        connection.execute(
            delete(BULK_ROUTES).where(
                BULK_ROUTES.c.destination == rule.destination, BULK_ROUTES.c.owner.in_(gone)
            )
        )
        connection.execute(delete(ITEMS).where(ITEMS.c.id.in_(gone)))
    return _page(page, limit, pruned=len(gone))


def prune_idle_lanes(
    engine: Engine, idle_before: datetime, limit: int, after: PruneCursor | None = None
) -> PrunePageResult:
    """Delete up to `limit` rows of lanes idle since before `idle_before` (nothing waiting:
    their workflows have ended, or soon will), oldest first after `after` (`PruneCursor`: the
    row's `updated_at` and id). A lane that started again meanwhile has moved its row on (not
    idle, or a newer time) and is left alone; its next start writes a new row."""
    idle = [LANES.c.status == LaneStatus.IDLE.value, LANES.c.updated_at < idle_before]
    conditions = list(idle)
    if after is not None:
        conditions.append(_past(LANES.c.updated_at, LANES.c.id, after))
    query = (
        select(LANES.c.id, LANES.c.updated_at.label("finished_at"))
        .where(and_(*conditions))
        .order_by(LANES.c.updated_at, LANES.c.id)
        .limit(limit)
    )
    with engine.begin() as connection:
        page = _locked(connection, query)
        if len(page) < limit:
            # The run's last page of lanes: routes left with nothing they route go too.
            _prune_orphan_routes(connection, idle_before, limit)
        if not page:
            return PrunePageResult(pruned=0, more=False, last=after)
        lanes = [r.id for r in page]
        # A bulk lane's route goes with its row, unless a hand-over claimed it since the cutoff
        # (its items are on their way to the shard the route names): the key's next items take
        # the count configured then (`readmodel.routes`).
        still_idle = select(LANES.c.id).where(LANES.c.id.in_(lanes), *idle)
        connection.execute(
            delete(BULK_ROUTES).where(
                BULK_ROUTES.c.owner.in_(still_idle), BULK_ROUTES.c.claimed_at < idle_before
            )
        )
        gone = connection.execute(delete(LANES).where(LANES.c.id.in_(lanes), *idle))
    return _page(page, limit, pruned=gone.rowcount)


def _prune_orphan_routes(connection: Connection, claimed_before: datetime, limit: int) -> None:
    """Delete up to `limit` bulk routes claimed before `claimed_before` whose owner has no row,
    neither an item's nor a lane's. A route outlives its owner's row when the
    hand-over that claimed it failed and was never sent again (no item or lane came of it), or
    when its idle lane's row went while a hand-over had claimed it lately (that hand-over then
    failed). An owner a shard holds has its row within moments (the API's `queued` row, the
    shard's lane projections), so one past the cutoff with none holds nothing, with one
    exception: an unordered item whose `queued` row failed to write is left to its first
    submit to write, which an item due later than the cutoff makes later; a repeat of its
    hand-over after the cutoff then goes by the sender's count. A claim that comes meanwhile
    moves `claimed_at` past the cutoff, which the delete checks again (a claim's new row
    version, on PostgreSQL)."""
    orphans = (
        select(BULK_ROUTES.c.destination, BULK_ROUTES.c.owner)
        .where(
            BULK_ROUTES.c.claimed_at < claimed_before,
            ~exists().where(ITEMS.c.id == BULK_ROUTES.c.owner),
            ~exists().where(LANES.c.id == BULK_ROUTES.c.owner),
        )
        .limit(limit)
    )
    connection.execute(
        delete(BULK_ROUTES).where(
            tuple_(BULK_ROUTES.c.destination, BULK_ROUTES.c.owner).in_(orphans),
            BULK_ROUTES.c.claimed_at < claimed_before,
        )
    )


def _selected(
    condition: ColumnElement[bool] | None,
    rule: RetentionRule,
    ended_before: datetime,
    limit: int,
    after: PruneCursor | None,
) -> Select[Any]:
    """The ids and end times of the rule's ended items that ended before the cutoff (and meet
    `condition`), oldest first after `after`."""
    conditions: list[ColumnElement[bool]] = [
        ITEMS.c.destination == rule.destination,
        ITEMS.c.finished_at < ended_before,
        ITEMS.c.status.in_(ENDED),
    ]
    if after is not None:
        conditions.append(_past(ITEMS.c.finished_at, ITEMS.c.id, after))
    if condition is not None:
        conditions.append(condition)
    if rule.outbox is not None:
        conditions.append(ITEMS.c.outbox == rule.outbox)
    elif rule.excluded:
        conditions.append(ITEMS.c.outbox.not_in(rule.excluded))
    return (
        select(ITEMS.c.id, ITEMS.c.finished_at)
        .where(and_(*conditions))
        .order_by(ITEMS.c.finished_at, ITEMS.c.id)
        .limit(limit)
    )


def _past(
    at: ColumnElement[datetime], row_id: ColumnElement[str], after: PruneCursor
) -> ColumnElement[bool]:
    """Rows after the cursor in `(at, row_id)` order. A row comparison: both databases start
    the index range at it, ties on `at` included; each value bound as its column's type (SQLite
    compares stored text)."""
    return tuple_(at, row_id) > tuple_(
        literal(after.finished_at, at.type), literal(after.item_id, row_id.type)
    )


def _locked(connection: Connection, query: Select[Any]) -> list[Row[Any]]:
    if connection.dialect.name == "postgresql":
        # Another run (two workers' schedules never overlap, but a manual run may) skips them.
        query = query.with_for_update(skip_locked=True)
    return list(connection.execute(query))


def _page(page: list[Row[Any]], limit: int, pruned: int | None = None) -> PrunePageResult:
    """A page's result: how many it pruned, whether a full page says there may be more, and
    its last item for the next page to start after."""
    last = page[-1]
    return PrunePageResult(
        pruned=len(page) if pruned is None else pruned,
        more=len(page) == limit,
        last=PruneCursor(finished_at=last.finished_at, item_id=last.id),
    )


def _remember(dialect: str, item_ids: list[str], now: datetime) -> Any:
    """Insert the items' key memories, keeping one already there (a page retried after its
    commit). Copied in SQL: the sealed digest moves as stored, never opened (a value whose key
    is gone still moves) nor sealed twice."""
    insert_into = postgresql.insert if dialect == "postgresql" else sqlite.insert
    kept = select(
        ITEMS.c.id,
        ITEMS.c.status,
        ITEMS.c.payload_hash,
        ITEMS.c.finished_at,
        literal(now, UTCDateTime()),
    ).where(ITEMS.c.id.in_(item_ids))
    return (
        insert_into(ITEM_KEYS)
        .from_select(["item_id", "status", "payload_hash", "finished_at", "pruned_at"], kept)
        .on_conflict_do_nothing(index_elements=["item_id"])
    )
