"""Backlog metrics for alerting, read from the read model when Prometheus scrapes `/metrics`.

Per outbox and destination: items queued, sending and failed (the dead letters), the age of the
oldest queued item, and the items sent and failed so far; per outbox: the items in ordering
lanes, the longest lane, and the running and halted lanes. A scrape reads the read model at most
once per `BACKLOG_METRICS_CACHE_S`, in a thread, and waits at most `BACKLOG_METRICS_TIMEOUT_S`;
when the reading fails or is late, only `outbox_backlog_scrape_ok 0` is exported for the backlog
(the API's own metrics are served as usual), so stale figures never pass for current ones.
The `outbox` label is bounded (`api/outbox_labels.py`): outboxes without a label of their own
are summed under `other`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from durable_outbox_temporal.contract.item import ItemStatus
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Engine

from api.outbox_labels import OutboxLabels
from readmodel.backlog import (
    BACKLOG_STATUSES,
    BUSY_LANE_STATUSES,
    Backlog,
    DeliveryTally,
    ItemBacklog,
    LaneBacklog,
    OutboxDestination,
    read_backlog,
)
from readmodel.db import in_thread
from service.relay import RelayStats, relay_stats

log = logging.getLogger("outbox.api")


@dataclass(frozen=True)
class Family:
    """One exported metric: its name, kind, labels and help (the docs and tests read these)."""

    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    documentation: str

    @property
    def sample_name(self) -> str:
        """The name PromQL queries: a counter's samples end in `_total`."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """An empty family to add samples to."""
        kind = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        return kind(self.name, self.documentation, labels=list(self.labels))


PER_DESTINATION = ("outbox", "destination")
ITEMS = Family(
    "outbox_items",
    "gauge",
    (*PER_DESTINATION, "status"),
    "Items per outbox, destination and status: queued (waiting, or backing off before a"
    " retry), sending (handed to the provider), failed (dead letters until redriven).",
)
OLDEST_QUEUED_AGE = Family(
    "outbox_oldest_queued_age_seconds",
    "gauge",
    PER_DESTINATION,
    "Seconds since the oldest queued item of the outbox and destination was enqueued;"
    " 0 when none is queued.",
)
SENT = Family(
    "outbox_items_sent",
    "counter",
    PER_DESTINATION,
    "Items delivered, per outbox and destination (the read model's sent events).",
)
FAILED = Family(
    "outbox_items_failed",
    "counter",
    PER_DESTINATION,
    "Items that failed permanently, per outbox and destination (the read model's failed"
    " events: a redriven item that fails again counts again).",
)
LANES = Family(
    "outbox_lanes",
    "gauge",
    ("outbox", "status"),
    "Ordering lanes holding items, per outbox and status (running, halted).",
)
LANE_ITEMS = Family(
    "outbox_lane_items",
    "gauge",
    ("outbox", "status"),
    "Items in ordering lanes (each lane's head and those waiting behind it), per outbox and"
    " lane status.",
)
LONGEST_LANE = Family(
    "outbox_longest_lane_items", "gauge", ("outbox",), "Items in the outbox's longest lane."
)
SCRAPE_OK = Family(
    "outbox_backlog_scrape_ok",
    "gauge",
    (),
    "1 if this scrape read the backlog from the read model; 0 if the reading failed or took"
    " too long, and then no other outbox backlog metric is exported.",
)
SCRAPE_DURATION = Family(
    "outbox_backlog_scrape_duration_seconds",
    "gauge",
    (),
    "How long the latest reading of the backlog from the read model took.",
)
RELAY_BACKLOG = Family(
    "outbox_relay_backlog",
    "gauge",
    ("status",),
    "Rows of the transactional outbox (`outbox_pending`) not relayed: pending (waiting for the"
    " relay) and refused (the outbox refused them for good; see their last_error).",
)
RELAY_LAG = Family(
    "outbox_relay_lag_seconds",
    "gauge",
    (),
    "Seconds since the oldest pending row of the transactional outbox was committed; 0 when"
    " none is pending.",
)
FAMILIES = (
    RELAY_BACKLOG,
    RELAY_LAG,
    ITEMS,
    OLDEST_QUEUED_AGE,
    SENT,
    FAILED,
    LANES,
    LANE_ITEMS,
    LONGEST_LANE,
    SCRAPE_OK,
    SCRAPE_DURATION,
)


class BacklogMetrics:
    """A Prometheus collector over the read model's backlog, registered on the API's registry.

    `refresh` (awaited by the `/metrics` route) reads the backlog when the last reading is older
    than `cache_s`; `collect` only formats the latest reading, so it never blocks the loop.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        cache_s: float,
        timeout_s: float,
        labels: OutboxLabels | None = None,
    ) -> None:
        self.cache_s = cache_s
        self.labels = labels or OutboxLabels()
        self.timeout_s = timeout_s
        self._engine: Engine | None = None
        self._tally = DeliveryTally()
        self._reading: asyncio.Task[None] | None = None
        # The latest reading, or None while the latest failed, timed out or none was made.
        self._backlog: Backlog | None = None
        self._read_at = -float("inf")
        self._duration_s = 0.0
        self._relay: RelayStats | None = None
        # Every outbox/destination (and lane outbox) seen since start, so a series that empties
        # reads 0 instead of vanishing (a vanished series looks like "no data" to an alert).
        self._pairs: set[OutboxDestination] = set()
        self._lane_outboxes: set[str] = set()
        # The outboxes the read model holds items of (their names, not their labels).
        self._outboxes: set[str] = set()
        registry.register(self)

    def knows_outbox(self, outbox: str) -> bool:
        """Whether a reading since start has seen items of `outbox` in the read model."""
        return outbox in self._outboxes

    def attach(self, engine: Engine) -> None:
        """Read from `engine` (the app's read model, known once the lifespan starts)."""
        self._engine = engine

    async def detach(self) -> None:
        """Stop reading; a reading still in its thread is waited for briefly (`in_thread`), then
        abandoned with its tally."""
        self._engine = None
        self._tally = DeliveryTally()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
            self._reading = None

    async def refresh(self) -> None:
        """Make sure the next `collect` has a reading at most `cache_s` old, or reports why not.

        Concurrent scrapes share one reading; a reading that outlasts `timeout_s` goes on in
        its thread and serves the scrapes after it.
        """
        if self._engine is None or time.monotonic() - self._read_at < self.cache_s:
            return
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read(self._engine))
        try:
            await asyncio.wait_for(asyncio.shield(self._reading), self.timeout_s)
        except TimeoutError:
            log.warning("backlog metrics: the read model took over %ss to answer", self.timeout_s)
            # The reading may have ended while `wait_for` was cancelling its wait: then its
            # backlog is the latest, and blanking it would hide it until the cache expires.
            if not self._reading.done():
                self._backlog = None

    async def _read(self, engine: Engine) -> None:
        started = time.perf_counter()
        try:
            backlog = await in_thread(read_backlog, engine, self._tally)
            self._relay = await in_thread(relay_stats, engine)
        except Exception as err:  # any failure: export scrape_ok 0 rather than fail /metrics
            log.warning(
                "backlog metrics: reading the read model failed: %s: %s", type(err).__name__, err
            )
            self._backlog = None
        else:
            self._outboxes.update(row.outbox for row in backlog.items)
            self._outboxes.update(outbox for outbox, _ in [*backlog.sent, *backlog.failed])
            self.labels.admit_most_active(_activity(backlog))
            self._backlog = _labelled(backlog, self.labels)
        finally:
            self._duration_s = time.perf_counter() - started
            self._read_at = time.monotonic()

    def describe(self) -> Iterable[Metric]:
        """The families `collect` yields (without samples), so the registry can check names."""
        return [family.family() for family in FAMILIES]

    def collect(self) -> Iterable[Metric]:
        backlog = self._backlog
        scrape_ok, duration = SCRAPE_OK.family(), SCRAPE_DURATION.family()
        scrape_ok.add_metric([], 0 if backlog is None else 1)
        duration.add_metric([], self._duration_s)
        yield from (scrape_ok, duration)
        if backlog is not None:
            yield from self._item_families(backlog, datetime.now(UTC))
            yield from self._lane_families(backlog)
            if self._relay is not None:
                relay, lag = RELAY_BACKLOG.family(), RELAY_LAG.family()
                relay.add_metric(["pending"], self._relay.pending)
                relay.add_metric(["refused"], self._relay.refused)
                lag.add_metric([], self._relay.oldest_pending_age_s)
                yield from (relay, lag)

    def _item_families(self, backlog: Backlog, now: datetime) -> Iterator[Metric]:
        counts: dict[tuple[str, str, ItemStatus], int] = {}
        oldest: dict[OutboxDestination, datetime] = {}
        for row in backlog.items:
            pair = (row.outbox, row.destination)
            counts[(*pair, row.status)] = row.items
            if row.status is ItemStatus.QUEUED:
                oldest[pair] = row.oldest_created_at
        self._pairs.update((row.outbox, row.destination) for row in backlog.items)
        self._pairs.update(backlog.sent)
        self._pairs.update(backlog.failed)
        pairs = sorted(self._pairs)

        items, age = ITEMS.family(), OLDEST_QUEUED_AGE.family()
        # Counters built from read-model events: those are append-only, so the totals only grow
        # (a restart of the API reads them from the database again, so they do not restart at 0).
        sent, failed = SENT.family(), FAILED.family()
        for pair in pairs:
            for status in BACKLOG_STATUSES:
                items.add_metric([*pair, status.value], counts.get((*pair, status), 0))
            since = oldest.get(pair)
            age.add_metric(list(pair), max(0.0, (now - since).total_seconds()) if since else 0.0)
            sent.add_metric(list(pair), backlog.sent.get(pair, 0))
            failed.add_metric(list(pair), backlog.failed.get(pair, 0))
        yield from (items, age, sent, failed)

    def _lane_families(self, backlog: Backlog) -> Iterator[Metric]:
        self._lane_outboxes.update(row.outbox for row in backlog.lanes)
        by_status = {(row.outbox, row.status): row for row in backlog.lanes}
        lanes, lane_items, longest = LANES.family(), LANE_ITEMS.family(), LONGEST_LANE.family()
        for outbox in sorted(self._lane_outboxes):
            rows = [by_status.get((outbox, status)) for status in BUSY_LANE_STATUSES]
            for status, row in zip(BUSY_LANE_STATUSES, rows, strict=True):
                lanes.add_metric([outbox, status.value], row.lanes if row else 0)
                lane_items.add_metric([outbox, status.value], row.items if row else 0)
            longest.add_metric([outbox], max((row.longest for row in rows if row), default=0))
        yield from (lanes, lane_items, longest)


def _activity(backlog: Backlog) -> dict[str, int]:
    """Per outbox: items held in the backlog, sent and failed (what ranks it for a label)."""
    activity: Counter[str] = Counter()
    for row in backlog.items:
        activity[row.outbox] += row.items
    for totals in (backlog.sent, backlog.failed):
        for (outbox, _), count in totals.items():
            activity[outbox] += count
    return dict(activity)


def _labelled(backlog: Backlog, labels: OutboxLabels) -> Backlog:
    """`backlog` with each outbox replaced by its label, rows of one label summed (the oldest
    item the oldest of them, the longest lane the longest)."""
    items: dict[tuple[str, str, ItemStatus], ItemBacklog] = {}
    for row in backlog.items:
        key = (labels.label(row.outbox), row.destination, row.status)
        seen = items.get(key)
        items[key] = ItemBacklog(
            key[0],
            row.destination,
            row.status,
            row.items + (seen.items if seen else 0),
            min(row.oldest_created_at, seen.oldest_created_at) if seen else row.oldest_created_at,
        )
    lanes: dict[tuple[str, object], LaneBacklog] = {}
    for lane in backlog.lanes:
        lane_key = (labels.label(lane.outbox), lane.status)
        had = lanes.get(lane_key)
        lanes[lane_key] = LaneBacklog(
            lane_key[0],
            lane.status,
            lane.lanes + (had.lanes if had else 0),
            lane.items + (had.items if had else 0),
            max(lane.longest, had.longest if had else 0),
        )

    def summed(totals: Mapping[OutboxDestination, int]) -> Counter[OutboxDestination]:
        by_label: Counter[OutboxDestination] = Counter()
        for (outbox, destination), count in totals.items():
            by_label[(labels.label(outbox), destination)] += count
        return by_label

    return Backlog(
        list(items.values()), list(lanes.values()), summed(backlog.sent), summed(backlog.failed)
    )
