"""Delivery reports: find each report's item by the provider's message id and signal it.

The read model finds the item: the projection already writes `provider_message_id` when the
provider accepts an item, so the lookup costs no extra write on the item path (a search
attribute would cost an upsert per item). Why: docs/decisions/report-lookup-read-model.md
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.item import DeliveryReport
from durable_outbox_temporal.fan_out import fan_out
from sqlalchemy import Engine

from readmodel import store
from readmodel.delivery_reports import record_late_report
from readmodel.erasure import ERASED

log = logging.getLogger("outbox.reports")

# Unknown message ids already logged: a provider retrying the same stray report is logged once.
_LOGGED_UNKNOWN = 10_000
# A report on a message no item holds yet, about a delivery attempt this recent, may have
# overtaken the item's own record of its send (the worker writes the provider's message id just
# after the provider accepts, and a fast provider reports within the same second): it is sent
# back to be delivered again (`early`) rather than dropped. An older one is `unknown`, so a
# provider's stray reports are retried for this long at most.
EARLY_REPORT_WINDOW = timedelta(minutes=10)


@dataclass
class ReportTally:
    """What became of a delivery's reports."""

    # Signalled to their item, which applies each once (a repeat changes nothing).
    applied: int = 0
    # No item holds the message id (not ours, or sent before the item's accept was recorded), or
    # its item holds it but expects no report on that recipient.
    unknown: int = 0
    # After the item's report window (by the destination's `report_window_s` now): recorded in
    # its read-model row (`readmodel/delivery_reports.py`), by the API when the item's workflow
    # has ended, else by the shard or lane that let it go; a repeat changes nothing there either.
    late: int = 0
    # No item holds the message id yet, and the attempt is within `EARLY_REPORT_WINDOW`: the
    # provider is asked to deliver the reports again (503), when the item may hold it.
    early: int = 0


class DeliveryReportService:
    """Routes providers' delivery reports to their items' workflows."""

    def __init__(self, client: OutboxClient, engine: Engine) -> None:
        self.client = client
        self.engine = engine
        self._logged_unknown: OrderedDict[str, None] = OrderedDict()

    async def receive(self, destination: str, reports: Sequence[DeliveryReport]) -> ReportTally:
        """Signal each report to its item. Raises only when Temporal or the database is
        unreachable, so the provider delivers again later and nothing is lost; `early` reports
        are the caller's to send back (a repeat of the others changes nothing)."""
        tally = ReportTally()
        if not reports:
            return tally
        item_ids = await asyncio.to_thread(
            store.items_by_message_id,
            self.engine,
            destination,
            [report.message_id for report in reports],
        )
        routed: list[tuple[store.ReportTarget, DeliveryReport]] = []
        recent = datetime.now(UTC) - EARLY_REPORT_WINDOW
        for report in reports:
            found = item_ids.get(report.message_id)
            if found is None and report.at >= recent:
                tally.early += 1
            elif found is not None and ERASED in found.recipients:
                # An erased item (after its window, or it could not have been erased): there is
                # no address left to apply it to, and none must reach a log line.
                tally.late += 1
            elif found is None or (
                found.recipients and report.recipient.casefold() not in found.recipients
            ):
                tally.unknown += 1
                self._log_unknown(destination, report)
            else:
                routed.append((found, report))
        outcomes = await fan_out(
            [
                functools.partial(
                    self.client.report_delivery,
                    found.item_id,
                    report,
                    destination,
                    ordering_key=found.ordering_key,
                    shards=found.shards,
                )
                for found, report in routed
            ]
        )
        late: list[tuple[str, DeliveryReport]] = []
        target = self.client.destinations.get(destination)
        window = timedelta(seconds=target.delivery.report_window_s if target is not None else 0)
        now = datetime.now(UTC)
        for (found, report), outcome in zip(routed, outcomes, strict=True):
            if isinstance(outcome, Exception):
                raise outcome
            sent_at = found.sent_at
            if not outcome:
                late.append((found.item_id, report))
            elif sent_at is not None and sent_at + window < now:
                # Past the window: a bulk or lane item's shard or lane, which runs on, took it
                # and records it in the item's row (`workflows/host.py`).
                tally.late += 1
            else:
                tally.applied += 1
        for item_id, report in late:
            # No workflow holds the item any more: its row takes the report.
            await asyncio.to_thread(
                record_late_report,
                self.engine,
                destination,
                item_id,
                report,
                datetime.now(UTC),
            )
            tally.late += 1
        return tally

    def _log_unknown(self, destination: str, report: DeliveryReport) -> None:
        stray = f"{report.message_id}/{report.recipient}"
        if stray in self._logged_unknown:
            return
        self._logged_unknown[stray] = None
        if len(self._logged_unknown) > _LOGGED_UNKNOWN:
            self._logged_unknown.popitem(last=False)
        log.warning(
            "delivery report for unknown message or recipient %s at %s (recipient %s, %s);"
            " accepted, ignored",
            report.message_id,
            destination,
            report.recipient,
            report.status.value,
        )
