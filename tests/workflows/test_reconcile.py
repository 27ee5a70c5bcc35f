"""A submit whose answer was lost, retried after the provider's dedupe window: the reconcile step,
for ACS email (repeatable requests, 412 past the window) and an `http` payment API (an
`Idempotency-Key` it forgets, then executes the call anew).

On the dev server (real time: the fake's window is on the wall clock) with a 2-second window at
the fake and in the destination, and a backoff longer than it, so the retry comes past it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus, RecipientStatus
from durable_outbox_temporal.destinations import Destination

from activities.providers.acs_email import AcsEmailProvider
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from readmodel import store
from tests.conftest import email_destination, payment_destination, sms_destination
from tests.workflows.test_outbox_item import EMAIL, wait_for_status

WINDOW_S = 2.0
PAYMENT = {"amount": 2000, "currency": "eur", "payment_method": "pm_card_visa"}


@pytest.fixture
async def forgetful_fake() -> AsyncIterator[FakeProvider]:
    """A fake ACS that tracks repeatable sends for `WINDOW_S` only."""
    faults = FaultConfig(repeatability_window_s=WINDOW_S, payment_key_window_s=WINDOW_S)
    async with run_fake_provider(faults) as fake:
        yield fake


async def enqueue_with_lost_answer(
    stack, destination, fake: FakeProvider, payload=EMAIL
) -> tuple[str, str]:
    """Enqueue an item whose first submit the provider takes and whose answer is then lost."""
    key = uuid.uuid4().hex
    item_id = item_workflow_id("tests", key)
    provider_key = provider_idempotency_key(item_id)
    await fake.admin.script(provider_key, [{"drop_response": True}])
    await stack.enqueue(destination, payload, key=key)
    return item_id, provider_key


def past_the_window(fake: FakeProvider) -> Destination:
    """An email destination at `fake` whose first retry comes after the window has passed."""
    return email_destination(
        fake,
        settings={"repeatability_window_s": WINDOW_S},
        backoff_initial_s=WINDOW_S + 1.5,
        backoff_jitter=0,
    )


async def test_a_lost_answer_retried_past_the_window_is_sent_once_and_ends_sent(
    dev_env, stack_factory, forgetful_fake
) -> None:
    destination = past_the_window(forgetful_fake)
    stack = await stack_factory(destination, env=dev_env)
    item_id, provider_key = await enqueue_with_lost_answer(stack, destination, forgetful_fake)

    view = await stack.result(item_id)

    assert view.status is ItemStatus.SENT
    assert view.attempts == 2
    stats = await forgetful_fake.admin.key_stats(provider_key)
    # One send: the retry looked the operation up and adopted it, then polled it to the end.
    assert (stats["submits"], stats["deliveries"]) == (1, 1)
    assert (await forgetful_fake.admin.stats())["totals"]["duplicates"] == 0
    accepted = [
        event.detail
        for event in store.item_events(stack.engine, item_id)
        if event.type == "accepted"
    ]
    assert len(accepted) == 1 and "found by lookup" in (accepted[0] or "")


async def test_without_the_reconcile_step_the_same_retry_is_refused_with_412(
    dev_env, stack_factory, forgetful_fake, monkeypatch
) -> None:
    """The test above would pass against a fake that never forgets; this one shows the fake
    forgets, and what the reconcile step prevents: the naive retry fails the item."""
    monkeypatch.setattr(AcsEmailProvider, "reconcile", False)
    destination = past_the_window(forgetful_fake)
    stack = await stack_factory(destination, env=dev_env)
    item_id, provider_key = await enqueue_with_lost_answer(stack, destination, forgetful_fake)

    failure = await stack.failure(item_id)

    assert "412" in failure.message
    view = await stack.outbox.status("tests", item_id.rsplit("/", 1)[-1])
    assert view.status is ItemStatus.FAILED
    # The email went out all the same: failed here, delivered there.
    stats = await forgetful_fake.admin.key_stats(provider_key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1)


def payment_past_the_window(fake: FakeProvider, **settings) -> Destination:
    """An http destination at the fake's payment API whose first retry comes after the key
    window has passed."""
    return payment_destination(
        fake,
        settings={"idempotency_window_s": WINDOW_S, **settings},
        backoff_initial_s=WINDOW_S + 1.5,
        backoff_jitter=0,
    )


async def test_a_lost_payment_answer_retried_past_the_window_is_paid_once_and_ends_sent(
    dev_env, stack_factory, forgetful_fake
) -> None:
    destination = payment_past_the_window(forgetful_fake)
    stack = await stack_factory(destination, env=dev_env)
    item_id, provider_key = await enqueue_with_lost_answer(
        stack, destination, forgetful_fake, PAYMENT
    )

    view = await stack.result(item_id)

    assert view.status is ItemStatus.SENT
    assert view.attempts == 2
    payments = await forgetful_fake.admin.deliveries("payments")
    assert [e["key"] for e in payments] == [provider_key]
    assert view.provider_message_id is not None and view.provider_message_id.startswith("pay_")
    sent = [e.detail for e in store.item_events(stack.engine, item_id) if e.type == "sent"]
    assert len(sent) == 1 and "found by lookup" in (sent[0] or "")


async def test_without_a_status_url_the_same_payment_retry_pays_twice(
    dev_env, stack_factory, forgetful_fake
) -> None:
    """The fake forgets the key as Stripe does: without the lookup the retry is a new payment."""
    destination = payment_past_the_window(forgetful_fake, status_url=None)
    stack = await stack_factory(destination, env=dev_env)
    item_id, provider_key = await enqueue_with_lost_answer(
        stack, destination, forgetful_fake, PAYMENT
    )

    view = await stack.result(item_id)

    assert view.status is ItemStatus.SENT
    payments = await forgetful_fake.admin.deliveries("payments")
    assert [e["key"] for e in payments] == [provider_key, provider_key]


async def test_an_sms_whose_answer_was_lost_is_not_sent_again_past_the_window_but_left_pending(
    dev_env, stack_factory, forgetful_fake
) -> None:
    """ACS SMS has no lookup by our id, so past its window the outbox never re-sends: ACS
    refuses the repeat (412), the number stays `pending` for its delivery report to settle
    (docs/how-to/send-sms.md)."""
    forgetful_fake.state.sms.window_s = WINDOW_S
    destination = sms_destination(
        forgetful_fake, backoff_initial_s=WINDOW_S + 1.5, backoff_jitter=0, report_window_s=3600
    )
    stack = await stack_factory(destination, env=dev_env)
    number = "+15550142"
    sms = {"from": "+18005550100", "smsRecipients": [{"to": number}], "message": "Booked"}
    item_id, provider_key = await enqueue_with_lost_answer(stack, destination, forgetful_fake, sms)
    key = item_id.rsplit("/", 1)[-1]

    await wait_for_status(stack, key, status=ItemStatus.SENT)

    view = await stack.outbox.status("tests", key)
    assert view.attempts == 2
    (recipient,) = view.recipients
    assert recipient.address == number and recipient.status is RecipientStatus.PENDING
    assert (recipient.detail or "").startswith("HTTP 412: ")
    sent = [e["key"] for e in await forgetful_fake.admin.deliveries("sms")]
    assert sent == [f"{provider_key}/{number}"]  # one message, from the first attempt
