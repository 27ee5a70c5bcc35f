"""A submit whose answer was lost, retried after ACS's repeatability window: the reconcile step.

On the dev server (real time: the fake's window is on the wall clock) with a 2-second window at
the fake and in the destination, and a backoff longer than it, so the retry comes past it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.destinations import Destination

from activities.providers.acs_email import AcsEmailProvider
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from readmodel import store
from tests.conftest import email_destination
from tests.workflows.test_outbox_item import EMAIL

WINDOW_S = 2.0


@pytest.fixture
async def forgetful_fake() -> AsyncIterator[FakeProvider]:
    """A fake ACS that tracks repeatable sends for `WINDOW_S` only."""
    async with run_fake_provider(FaultConfig(repeatability_window_s=WINDOW_S)) as fake:
        yield fake


async def enqueue_with_lost_answer(stack, destination, fake: FakeProvider) -> tuple[str, str]:
    """Enqueue an email whose first send ACS takes and whose answer is then lost."""
    key = uuid.uuid4().hex
    item_id = item_workflow_id("tests", key)
    provider_key = provider_idempotency_key(item_id)
    await fake.admin.script(provider_key, [{"drop_response": True}])
    await stack.enqueue(destination, EMAIL, key=key)
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
