"""Destination metrics, read from the Temporal server when Prometheus scrapes `/metrics`: per
configured destination, whether it is paused (by hand, a 410, a throttle or an open circuit),
throttled until a time, its circuit open, disabled after failing too long, and the submit rate
in force (`flowcontrol/`).

A scrape reads each destination's two task queues (`DescribeTaskQueue`) at most once per
`cache_s` and waits at most `timeout_s`; when the reading fails or is late, only
`outbox_destinations_scrape_ok 0` is exported for them, so a stale state never passes for the
current one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from api.backlog_metrics import Family
from service.destinations import DestinationControls, DestinationState

log = logging.getLogger("outbox.api")

PER_DESTINATION = ("destination",)
PAUSED = Family(
    "outbox_destination_paused",
    "gauge",
    PER_DESTINATION,
    "1 while the destination's submit or poll queue is paused: by hand, by a 410, by a"
    " provider's throttle or by its open circuit.",
)
THROTTLED = Family(
    "outbox_destination_throttled",
    "gauge",
    PER_DESTINATION,
    "1 while a provider's throttle (429/503 with Retry-After) pauses the destination; it resumes"
    " by itself.",
)
CIRCUIT_OPEN = Family(
    "outbox_destination_circuit_open",
    "gauge",
    PER_DESTINATION,
    "1 while the destination's circuit is open: its submits kept failing, probes go at"
    " intervals, items wait.",
)
DISABLED = Family(
    "outbox_destination_disabled",
    "gauge",
    PER_DESTINATION,
    "1 while the destination is disabled: it failed for `disable_after_s` (or was disabled by"
    " hand); items wait until an operator re-enables it.",
)
SUBMIT_RATE = Family(
    "outbox_destination_submit_rate",
    "gauge",
    PER_DESTINATION,
    "The submit rate the Temporal server holds the destination to now, in requests a second"
    " (0 while paused).",
)
SHARDS = Family(
    "outbox_destination_shards",
    "gauge",
    PER_DESTINATION,
    "A bulk-mode destination's shard workflows (its `shards`); no sample for an item-mode one."
    " `outbox_items` over it is what each shard holds, about.",
)
SCRAPE_OK = Family(
    "outbox_destinations_scrape_ok",
    "gauge",
    (),
    "1 when the last reading of the destinations' state from Temporal succeeded in time.",
)
FAMILIES = (PAUSED, THROTTLED, CIRCUIT_OPEN, DISABLED, SUBMIT_RATE, SHARDS, SCRAPE_OK)


class DestinationMetrics:
    """A Prometheus collector over the destinations' state on the Temporal server."""

    def __init__(self, registry: CollectorRegistry, *, cache_s: float, timeout_s: float) -> None:
        self.cache_s = cache_s
        self.timeout_s = timeout_s
        self._controls: DestinationControls | None = None
        self._reading: asyncio.Task[None] | None = None
        self._states: list[DestinationState] | None = None
        self._read_at = -float("inf")
        registry.register(self)

    def attach(self, controls: DestinationControls) -> None:
        self._controls = controls

    async def detach(self) -> None:
        self._controls = None
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
            self._reading = None

    async def refresh(self) -> None:
        """Make sure the next `collect` has a reading at most `cache_s` old, or says why not."""
        if self._controls is None or time.monotonic() - self._read_at < self.cache_s:
            return
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read(self._controls))
        try:
            await asyncio.wait_for(asyncio.shield(self._reading), self.timeout_s)
        except TimeoutError:
            log.warning("destination metrics: Temporal took over %ss to answer", self.timeout_s)
            self._states = None

    async def _read(self, controls: DestinationControls) -> None:
        try:
            self._states = await controls.states()
        except Exception as err:  # any failure: export scrape_ok 0 rather than fail /metrics
            log.warning("destination metrics: reading failed: %s: %s", type(err).__name__, err)
            self._states = None
        finally:
            self._read_at = time.monotonic()

    def describe(self) -> Iterable[Metric]:
        return [family.family() for family in FAMILIES]

    def collect(self) -> Iterable[Metric]:
        states = self._states
        scrape_ok = SCRAPE_OK.family()
        scrape_ok.add_metric([], 0 if states is None else 1)
        yield scrape_ok
        if states is None:
            return
        paused, throttled = PAUSED.family(), THROTTLED.family()
        circuit, rate = CIRCUIT_OPEN.family(), SUBMIT_RATE.family()
        disabled, shards = DISABLED.family(), SHARDS.family()
        for state in states:
            name = [state.destination.name]
            if state.destination.mode == "bulk":
                shards.add_metric(name, state.destination.shards)
            paused.add_metric(name, int(state.paused))
            throttled.add_metric(name, int(state.submit.paused_until is not None))
            circuit.add_metric(name, int(state.circuit == "open"))
            disabled.add_metric(name, int(state.disabled))
            rate.add_metric(name, state.submit.rate)
        yield from (paused, throttled, circuit, disabled, rate, shards)
