"""Delivery reports applied to an item's recipients: pure functions, no Temporal."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    DeliveryReport,
    Recipient,
    RecipientStatus,
    apply_delivery_report,
    delivery_outcome,
)

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def report(
    recipient: str, status: RecipientStatus, seconds: float, detail: str | None = None
) -> DeliveryReport:
    return DeliveryReport(
        message_id="m-1",
        recipient=recipient,
        status=status,
        at=T0 + timedelta(seconds=seconds),
        detail=detail,
    )


def test_a_report_settles_its_pending_recipient() -> None:
    recipients = [Recipient("ada@example.com"), Recipient("bob@example.com")]

    changed = apply_delivery_report(
        recipients, report("ada@example.com", RecipientStatus.DELIVERED, 1, "250 OK")
    )

    assert changed == Recipient(
        "ada@example.com", RecipientStatus.DELIVERED, "250 OK", T0 + timedelta(seconds=1)
    )
    assert recipients[1].status is RecipientStatus.PENDING


def test_a_duplicate_report_changes_nothing() -> None:
    recipients = [Recipient("ada@example.com")]
    delivered = report("ada@example.com", RecipientStatus.DELIVERED, 1)

    assert apply_delivery_report(recipients, delivered) is not None
    assert apply_delivery_report(recipients, delivered) is None
    assert len(recipients) == 1


def test_an_older_report_arriving_late_is_ignored() -> None:
    recipients = [Recipient("ada@example.com")]
    apply_delivery_report(recipients, report("ada@example.com", RecipientStatus.DELIVERED, 5))

    stale = report("ada@example.com", RecipientStatus.QUARANTINED, 2)

    assert apply_delivery_report(recipients, stale) is None
    assert recipients[0].status is RecipientStatus.DELIVERED


def test_any_arrival_order_and_repeats_end_in_the_same_state() -> None:
    reports = [
        report("ada@example.com", RecipientStatus.QUARANTINED, 1, "held"),
        report("ada@example.com", RecipientStatus.DELIVERED, 4, "released"),
        report("bob@example.com", RecipientStatus.BOUNCED, 3, "550"),
        # Same moment, two statuses: the order still decides one winner.
        report("cy@example.com", RecipientStatus.DELIVERED, 2),
        report("cy@example.com", RecipientStatus.FAILED, 2),
    ]
    outcomes = set()
    for order in itertools.permutations(reports + reports[:2]):
        recipients = [Recipient("ada@example.com"), Recipient("bob@example.com")]
        for each in order:
            apply_delivery_report(recipients, each)
        outcomes.add(tuple(sorted((r.address, r.status.value, r.detail or "") for r in recipients)))
    assert outcomes == {
        (
            ("ada@example.com", "delivered", "released"),
            ("bob@example.com", "bounced", "550"),
            ("cy@example.com", "failed", ""),
        )
    }


def test_addresses_match_without_regard_to_case() -> None:
    recipients = [Recipient("Ada@Example.com")]

    apply_delivery_report(recipients, report("ada@example.COM", RecipientStatus.DELIVERED, 1))

    assert recipients == [
        Recipient("Ada@Example.com", RecipientStatus.DELIVERED, None, T0 + timedelta(seconds=1))
    ]


def test_a_report_on_an_unlisted_recipient_adds_it() -> None:
    recipients = [Recipient("list@example.com", RecipientStatus.EXPANDED)]

    apply_delivery_report(recipients, report("member@example.com", RecipientStatus.DELIVERED, 1))

    assert [r.address for r in recipients] == ["list@example.com", "member@example.com"]


def test_outcome_summarises_the_recipients() -> None:
    pending, delivered = RecipientStatus.PENDING, RecipientStatus.DELIVERED
    assert delivery_outcome([]) is None
    assert delivery_outcome([Recipient("a", pending)]) is DeliveryOutcome.PENDING
    assert delivery_outcome([Recipient("a", delivered), Recipient("b", pending)]) is (
        DeliveryOutcome.PENDING
    )
    assert (
        delivery_outcome([Recipient("a", delivered), Recipient("b", RecipientStatus.EXPANDED)])
        is DeliveryOutcome.DELIVERED
    )
    for failed in ("bounced", "suppressed", "filtered_spam", "quarantined", "failed"):
        recipients = [Recipient("a", pending), Recipient("b", RecipientStatus(failed))]
        assert delivery_outcome(recipients) is DeliveryOutcome.BOUNCED, failed


def test_only_final_reports_settle_a_recipient() -> None:
    unsettled = {s for s in RecipientStatus if not s.settled}
    assert unsettled == {
        RecipientStatus.PENDING,
        RecipientStatus.EXPANDED,
        RecipientStatus.QUARANTINED,
    }
