"""The transactional outbox on SQLite and PostgreSQL: a rolled-back transaction enqueues
nothing, a committed one exactly once (a relay killed between the enqueue and the mark: see
tests/faults/test_relay_kill.py), one key's rows in commit order, and on PostgreSQL three
relays share 2,000 rows with no duplicate and none left behind."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from durable_outbox_temporal import EnqueueResult, InvalidRequest, OutboxClient
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.destinations import DestinationRegistry
from durable_outbox_temporal.transactional import enqueue_in
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from api.backlog_metrics import BacklogMetrics
from examples.booking_app import create_booking_app
from readmodel.models import OUTBOX_PENDING
from service.relay import Relay, relay_stats
from tests.api.conftest import api_settings, open_api
from tests.conftest import email_destination, sms_destination, unique_name, webhook_destination
from tests.fakes import deliveries, script
from tests.workflows.test_lane import item_result


def statuses(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(select(OUTBOX_PENDING.c.status)).scalars())


async def test_a_rolled_back_transaction_enqueues_nothing_and_a_committed_one_once(
    engine: Engine, stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    relay = Relay(stack.outbox, engine)
    kept, dropped = unique_name("kept"), unique_name("dropped")

    with Session(engine) as session:
        enqueue_in(
            session, outbox="tests", destination=destination.name, payload={"n": 1}, key=dropped
        )
        session.rollback()
    with Session(engine) as session, session.begin():
        enqueue_in(
            session, outbox="tests", destination=destination.name, payload={"n": 2}, key=kept
        )
    with pytest.raises(InvalidRequest), Session(engine) as session:
        enqueue_in(session, outbox="tests", destination=destination.name, payload={}, key="a/b")

    assert await relay.relay_once() == 1
    assert await relay.relay_once() == 0
    await stack.result(item_workflow_id("tests", kept))
    assert await deliveries(fake_provider, item_workflow_id("tests", kept)) == 1
    assert await deliveries(fake_provider, item_workflow_id("tests", dropped)) == 0
    assert statuses(engine) == ["relayed"]
    assert relay_stats(engine).pending == 0


async def test_one_keys_rows_are_relayed_in_commit_order(
    engine: Engine, stack_factory, fake_provider, dev_env
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
    # The dev server: once, on a loaded CI run, the time-skipping server refused the lane's
    # workflow task ("invalid history builder state for action") and the last item stayed
    # queued; nothing here needs time skipped.
    stack = await stack_factory(destination, env=dev_env)
    keys = [unique_name(f"seq{n}") for n in range(5)]
    for n, key in enumerate(keys):
        with Session(engine) as session, session.begin():
            enqueue_in(
                session,
                outbox="tests",
                destination=destination.name,
                payload={"n": n},
                key=key,
                ordering_key="k1",
            )
    relay = Relay(stack.outbox, engine)
    while await relay.relay_once():
        pass

    assert statuses(engine) == ["relayed"] * 5
    for key in keys:
        await item_result(stack, key)  # each waits in the lane until its turn
    arrived = [
        entry["payload"]["n"] for entry in await fake_provider.admin.deliveries(destination.name)
    ]
    assert arrived == [0, 1, 2, 3, 4]
    # An unknown destination is refused with the reason, and does not hold its key up.
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="tests", destination="nowhere", payload={}, key=unique_name("x"))
    assert await relay.relay_once() == 1
    assert relay_stats(engine).refused == 1


class Counting(OutboxClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.created: list[str] = []

    async def enqueue(self, *args: Any, **kwargs: Any) -> EnqueueResult:
        result = await super().enqueue(*args, **kwargs)
        if result.created:
            self.created.append(result.item_id)
        return result


ROWS = 600


async def test_three_relays_share_six_hundred_rows_on_postgres(
    postgres_engine: Engine, dev_env, fake_provider
) -> None:
    # The dev server, and a queue no worker polls: the items only need to be started.
    destination = webhook_destination(fake_provider)
    outbox = Counting(
        dev_env.client, DestinationRegistry({destination.name: destination}), unique_name("q")
    )
    run = unique_name("r")
    with Session(postgres_engine) as session, session.begin():
        for n in range(ROWS):
            enqueue_in(
                session,
                outbox="relayed",
                destination=destination.name,
                payload={"n": n},
                key=f"{run}-{n}",
            )

    # Twelve batches of 50 for three relays: each claims batches while the others hold theirs
    # (the same check with 2,000 rows took 40 s of a test process's CPU in the suite).
    relays = [Relay(outbox, postgres_engine, batch=50) for _ in range(3)]

    async def drain(relay: Relay) -> None:
        while await relay.relay_once():
            pass

    await asyncio.gather(*(drain(relay) for relay in relays))

    assert len(outbox.created) == ROWS == len(set(outbox.created))
    assert statuses(postgres_engine) == ["relayed"] * ROWS
    assert all(relay.relayed > 0 for relay in relays)  # all three took part


async def test_the_relay_backlog_and_lag_are_exported(engine: Engine) -> None:
    registry = CollectorRegistry()
    metrics = BacklogMetrics(registry, cache_s=0, timeout_s=5)
    metrics.attach(engine)
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="tests", destination="fake-webhook", payload={}, key="waits")

    await metrics.refresh()
    exported = generate_latest(registry).decode()

    assert 'outbox_relay_backlog{status="pending"} 1.0' in exported
    assert "outbox_relay_lag_seconds " in exported
    await metrics.detach()


async def test_the_booking_example_commits_a_booking_with_its_messages_or_nothing(
    engine: Engine, stack_factory, fake_provider
) -> None:
    email, sms = (
        email_destination(fake_provider, name="fake-email"),
        sms_destination(fake_provider, name="fake-sms"),
    )
    stack = await stack_factory(email, sms)
    transport = httpx.ASGITransport(app=create_booking_app(engine))
    booking = {
        "id": unique_name("b"),
        "customer": "Ada",
        "email": "ada@example.com",
        "phone": "+15550100",
        "at": "2030-01-01T09:30:00Z",
    }
    # The email's submit is slow: without the booking's lane its SMS would reach the provider
    # first, as the seed's example once did.
    await script(
        fake_provider, item_workflow_id("bookings", f"{booking['id']}-email"), [{"latency_ms": 300}]
    )

    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        created = await client.post("/bookings", json=booking)
        again = await client.post("/bookings", json=booking)  # exists: nothing more is sent
        bad_phone = await client.post(
            "/bookings", json={**booking, "id": unique_name("b"), "phone": "555-0100"}
        )
    assert created.status_code == 201 and again.status_code == 409
    assert bad_phone.status_code == 422 and "E.164" in bad_phone.text  # nothing enqueued
    assert statuses(engine) == ["pending", "pending"]
    relay = Relay(stack.outbox, engine)
    # One lane's rows go one pass after the other, in commit order.
    assert [await relay.relay_once() for _ in range(3)] == [1, 1, 0]
    email_key, sms_key = created.json()["email"], created.json()["sms"]
    for key in (email_key, sms_key):
        assert (await item_result(stack, key, "bookings")).status == "sent"
    assert await deliveries(fake_provider, item_workflow_id("bookings", email_key)) == 1
    email_tag = provider_idempotency_key(item_workflow_id("bookings", email_key))
    sms_tag = provider_idempotency_key(item_workflow_id("bookings", sms_key))
    sent = {entry["key"]: entry["seq"] for entry in await fake_provider.admin.deliveries()}
    # The SMS reached the provider once, and after its booking's email.
    assert [key for key in sent if key.startswith(sms_tag)] == [f"{sms_tag}/+15550100"]
    assert sent[email_tag] < sent[f"{sms_tag}/+15550100"]


async def test_an_sms_the_provider_would_refuse_is_a_refused_row_not_a_failed_delivery(
    engine: Engine, stack_factory, fake_provider
) -> None:
    sms = sms_destination(fake_provider)
    stack = await stack_factory(sms)
    payload = {"from": "+18005550100", "smsRecipients": [{"to": "555-0100"}], "message": "hi"}
    key = unique_name("sms")
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="tests", destination=sms.name, payload=payload, key=key)

    assert await Relay(stack.outbox, engine).relay_once() == 1

    with engine.connect() as connection:
        status, error = connection.execute(
            select(OUTBOX_PENDING.c.status, OUTBOX_PENDING.c.last_error)
        ).one()
    assert status == "refused"
    assert "smsRecipients[0].to: '555-0100' is not a phone number in E.164" in error
    tag = provider_idempotency_key(item_workflow_id("tests", key))
    sent = await fake_provider.admin.deliveries("sms")
    assert not any(entry["key"].startswith(tag) for entry in sent)  # nothing went


async def test_a_commit_wakes_the_relay_on_postgres(
    postgres_engine: Engine, stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    # Polling every minute: only the NOTIFY of the commit can make it this quick.
    relay = Relay(stack.outbox, postgres_engine, poll_interval_s=60)
    running = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(1)  # listening, and past its first (empty) pass
        with Session(postgres_engine) as session, session.begin():
            enqueue_in(
                session,
                outbox="tests",
                destination=destination.name,
                payload={},
                key=unique_name("w"),
            )
        for _ in range(100):
            if statuses(postgres_engine) == ["relayed"]:
                break
            await asyncio.sleep(0.05)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert statuses(postgres_engine) == ["relayed"]


async def run_for(relay: Relay, seconds: float) -> None:
    """Run the relay, and stop it after `seconds`."""
    running = asyncio.create_task(relay.run())
    await asyncio.sleep(seconds)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


# No row is relayed by these: the relay never calls its outbox.
IDLE_OUTBOX = OutboxClient(None, DestinationRegistry({}))  # type: ignore[arg-type]


class CountingPrunes(Relay):
    prunes = 0

    def _prune(self) -> None:
        self.prunes += 1
        super()._prune()


async def test_an_idle_relay_prunes_on_its_first_pass_and_then_once_a_minute(
    engine: Engine,
) -> None:
    # Relayed rows are kept for days: a delete every pass (four a second) was an idle relay's
    # cost for nothing.
    relay = CountingPrunes(IDLE_OUTBOX, engine, poll_interval_s=0.02)
    await run_for(relay, 0.5)  # about 25 passes
    assert relay.prunes == 1


class SlowClaim(Relay):
    """A relay whose claim holds its connection a while, and says when it let it go."""

    released = False

    def _claim(self) -> Any:
        with self._engine.connect() as connection:
            connection.execute(select(1))
            time.sleep(0.5)
        self.released = True
        return []


class CountingClaims(Relay):
    """A relay whose claims take 0.3 s and are counted; it does not LISTEN on PostgreSQL (the
    LISTEN's own wake-up, once connected, came during the second pass of a loaded run and
    brought a third)."""

    claims = 0

    def _claim(self) -> Any:
        self.claims += 1
        time.sleep(0.3)
        return []

    async def _listen(self) -> None:
        await asyncio.Event().wait()


async def test_a_wake_up_during_a_pass_brings_another_pass(engine: Engine) -> None:
    # What a commit's NOTIFY does on PostgreSQL while a pass runs: it must not be lost until the
    # next poll (a minute here).
    relay = CountingClaims(IDLE_OUTBOX, engine, poll_interval_s=60)

    async def wake_mid_pass() -> None:
        await asyncio.sleep(0.1)
        relay._wake.set()

    waking = asyncio.create_task(wake_mid_pass())
    await run_for(relay, 1.0)
    await waking
    assert relay.claims == 2


async def test_a_relay_stopped_mid_pass_gives_its_connection_back_before_it_ends(
    engine: Engine,
) -> None:
    # The caller disposes of the engine once the relay has stopped: a thread still holding a
    # connection then hands it to a disposed pool, never closed (psycopg warns when it is
    # collected, in whichever test runs then).
    relay = SlowClaim(IDLE_OUTBOX, engine, poll_interval_s=60)
    await run_for(relay, 0.2)  # stopped inside the claim
    assert relay.released


async def test_the_outbox_stats_show_the_relay_backlog(engine: Engine, stack_factory) -> None:
    stack = await stack_factory()
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="booked", destination="fake-email", payload={}, key="k1")

    async for http in open_api(stack, api_settings(workflow_task_queue=stack.task_queue)):
        stats = (await http.get("/v1/outboxes/booked/stats")).json()
        other = (await http.get("/v1/outboxes/elsewhere/stats")).json()

    assert stats["relay"]["pending"] == 1 and stats["relay"]["lag_s"] >= 0
    assert other["relay"] == {"pending": 0, "refused": 0, "lag_s": 0.0}


def test_relayed_rows_are_pruned_after_the_retention(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for key in ("old", "recent", "waiting"):
            enqueue_in(session, outbox="tests", destination="fake-email", payload={}, key=key)
    now = datetime.now(UTC)
    with engine.begin() as connection:
        for key, relayed_at in (("old", now - timedelta(days=8)), ("recent", now)):
            connection.execute(
                update(OUTBOX_PENDING)
                .where(OUTBOX_PENDING.c.key == key)
                .values(status="relayed", relayed_at=relayed_at)
            )

    Relay(IDLE_OUTBOX, engine)._prune()

    with engine.connect() as connection:
        left = connection.execute(select(OUTBOX_PENDING.c.key).order_by(OUTBOX_PENDING.c.key))
        assert list(left.scalars()) == ["recent", "waiting"]


class Breaking(OutboxClient):
    """An outbox whose enqueue of one key fails with an error no refusal stands for (a bug)."""

    def __init__(self, *args: Any, broken: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broken = broken

    async def enqueue(self, *args: Any, **kwargs: Any) -> EnqueueResult:
        if kwargs["key"] == self.broken:
            raise RuntimeError("cannot encode the payload")
        return await super().enqueue(*args, **kwargs)


async def test_a_row_that_keeps_failing_is_refused_with_the_reason_and_frees_its_key(
    engine: Engine, stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    broken, after = unique_name("broken"), unique_name("after")
    lane = unique_name("account")  # a lane of this test's own (its workflow id is outbox-wide)
    outbox = Breaking(
        stack.client,
        DestinationRegistry({destination.name: destination}),
        stack.task_queue,
        broken=broken,
    )
    relay = Relay(outbox, engine, max_attempts=3)
    with Session(engine) as session, session.begin():
        for key in (broken, after):
            enqueue_in(
                session,
                outbox="tests",
                destination=destination.name,
                payload={"key": key},
                key=key,
                ordering_key=lane,
            )

    settled = []
    for _ in range(4):
        settled.append(await relay.relay_once())
        with engine.begin() as connection:  # the lease runs out: the next pass may take it
            connection.execute(update(OUTBOX_PENDING).values(claimed_until=None))

    # Two passes fail the row and leave it pending (blocking its key), the third refuses it,
    # and the fourth relays the key's next row.
    assert settled == [0, 0, 1, 1]
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                OUTBOX_PENDING.c.key,
                OUTBOX_PENDING.c.status,
                OUTBOX_PENDING.c.attempts,
                OUTBOX_PENDING.c.last_error,
            ).order_by(OUTBOX_PENDING.c.id)
        ).all()
    assert [(row.key, row.status, row.attempts) for row in rows] == [
        (broken, "refused", 3),
        (after, "relayed", 1),
    ]
    assert rows[0].last_error == "gave up after 3 attempts: RuntimeError: cannot encode the payload"
    assert relay_stats(engine).refused == 1
    assert (await item_result(stack, after)).status == "sent"
