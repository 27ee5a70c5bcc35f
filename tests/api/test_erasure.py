"""Erasure by filter and of an aggregate's data, through the REST API (time-skipping server,
worker, fake provider, read model): `items:erase` answers 202 with the batch's status URL and
erases a subject's ended items, skipping (and naming) one under way; the subject is nowhere at
rest or in the answers; bad filters are problems naming the field. `DELETE .../data` shreds an
aggregate's events, which stay in order and read as the marker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from durable_outbox_temporal.contract.aggregate import SHREDDED
from durable_outbox_temporal.contract.erasure import erase_batch_workflow_id
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from examples.labour.projectors import LABOUR_HISTORY_PROJECTOR
from readmodel import erasure
from readmodel.models import OUTBOX_PENDING
from readmodel.projectors import base as projectors
from tests.api.conftest import Api
from tests.api.test_aggregates import flight_url
from tests.api.test_bulk_api import until_status
from tests.api.test_items import assert_problem, enqueue
from tests.api.test_purge import batch_end
from tests.readmodel.test_sealing import raw_text


async def test_a_subjects_ended_items_are_erased_as_a_batch(api: Api) -> None:
    run = uuid.uuid4().hex[:8]
    subject = f"ada-{run}@example.com"
    mine, theirs, later = f"{run}-mine-1", f"{run}-theirs", f"{run}-mine-later"
    for key, who in ((mine, subject), (theirs, f"bea-{run}@example.com")):
        response = await enqueue(api, key, subject=who)
        assert response.status_code == 202, response.text
        await until_status(api, key, "sent")
    queued = await enqueue(api, later, subject=subject, delay_seconds=3600)
    assert queued.status_code == 202, queued.text

    started = await api.http.post("/v1/outboxes/tests/items:erase", json={"subject": subject})

    assert started.status_code == 202, started.text
    assert started.headers["location"] == started.json()["links"]["self"]
    answers = await batch_end(api.http, started.headers["location"])
    end = answers[-1]
    assert (end["state"], end["done"], end["erased"], end["skipped"]) == (
        "completed",
        True,
        1,
        1,
    )
    assert end["by_subject"] is True and end["key_prefix"] is None
    await api.stack.record_history(erase_batch_workflow_id("tests", end["id"]), "_erase_batch")
    [skip] = end["skips"]
    assert skip["key"] == later and "queued" in skip["reason"]
    erased = (await api.http.get(f"/v1/outboxes/tests/items/{mine}")).json()
    kept = (await api.http.get(f"/v1/outboxes/tests/items/{theirs}")).json()
    assert erased["payload"] is None and erased["erased_at"] is not None
    assert kept["payload"] is not None and kept["erased_at"] is None
    # Only a keyed digest of the subject was ever kept, and no answer shows it.
    assert subject not in raw_text(api.stack.engine)
    assert all(subject not in str(answer) for answer in answers)


async def test_erase_refuses_bad_filters_naming_the_field(api: Api) -> None:
    both = await api.http.post(
        "/v1/outboxes/tests/items:erase", json={"key_prefix": "a", "subject": "b"}
    )
    neither = await api.http.post("/v1/outboxes/tests/items:erase", json={})
    empty = await api.http.post("/v1/outboxes/tests/items:erase", json={"key_prefix": ""})
    long_subject = await enqueue(api, f"k-{uuid.uuid4().hex[:8]}", subject="x" * 321)
    unknown = await api.http.get(f"/v1/outboxes/tests/erase-batches/{uuid.uuid4().hex}")

    for refused in (both, neither):
        assert "exactly one" in assert_problem(refused, 422)["detail"]
    assert "key_prefix" in str(assert_problem(empty, 422)["errors"])
    assert "subject" in str(assert_problem(long_subject, 422)["errors"])
    assert assert_problem(unknown, 404)["code"] == "erase-batch-not-found"


async def events_of(api: Api, flight: str, count: int) -> list[dict[str, Any]]:
    for _ in range(100):
        events: list[dict[str, Any]] = (await api.http.get(f"{flight_url(flight)}/events")).json()
        if len(events) >= count:
            return events
        await asyncio.sleep(0.05)
    raise AssertionError(f"the event store never held {count} events: {events}")


async def test_an_aggregates_data_is_shredded_and_its_events_stay(api: Api) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    passenger = f"p-{uuid.uuid4().hex}"
    await api.http.post(flight_url(flight, "open"), json={"seats": ["1A", "2B"]})
    await api.http.post(
        flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": passenger}
    )
    before = await events_of(api, flight, 2)

    erased = await api.http.delete(f"{flight_url(flight)}/data")
    again = await api.http.delete(f"{flight_url(flight)}/data")

    assert erased.status_code == 200, erased.text
    assert again.json() == erased.json()
    after = await events_of(api, flight, 2)
    assert [(e["seq"], e["type"], e["recorded_at"]) for e in after] == [
        (e["seq"], e["type"], e["recorded_at"]) for e in before
    ]
    assert [e["data"] for e in after] == [SHREDDED, SHREDDED]
    assert passenger not in raw_text(api.stack.engine)
    # The aggregate goes on; what it records from now on reads back.
    moved = await api.http.post(
        flight_url(flight, "assign_seat"), json={"seat": "2B", "passenger_id": "p2"}
    )
    assert moved.status_code == 200, moved.text
    newest = (await events_of(api, flight, 3))[-1]
    assert newest["data"] == {"seat": "2B", "passenger_id": "p2"}
    unknown = await api.http.delete(f"{flight_url('never-' + uuid.uuid4().hex[:6])}/data")
    assert_problem(unknown, 404)


async def test_an_erased_labour_leaves_the_projection_in_the_same_request(api: Api) -> None:
    """The labour projection's row goes with the erasure, no rebuild asked: the mother's name
    is nowhere in the database after it."""
    labour = f"lab{uuid.uuid4().hex[:6]}"
    mother, name = f"m-{uuid.uuid4().hex[:6]}", f"Ada{uuid.uuid4().hex}"
    url = f"/v1/aggregates/labour/{labour}"
    planned = await api.http.post(
        f"{url}/commands/plan_labour",
        json={"actor": mother, "mother_name": name, "contact": {"email": "ada@example.com"}},
    )
    assert planned.status_code == 200, planned.text
    rows_url = "/v1/projectors/labour_history/rows"
    for _ in range(200):
        projectors.project_batch(api.stack.engine, LABOUR_HISTORY_PROJECTOR)
        rows = (await api.http.get(rows_url, params={"mother": mother})).json()["items"]
        if rows:
            break
        await asyncio.sleep(0.05)
    assert [row["mother_name"] for row in rows] == [name]

    erased = await api.http.delete(f"{url}/data")

    assert erased.status_code == 200, erased.text
    assert (await api.http.get(rows_url, params={"mother": mother})).json()["items"] == []
    projectors.project_batch(api.stack.engine, LABOUR_HISTORY_PROJECTOR)
    assert (await api.http.get(rows_url, params={"mother": mother})).json()["items"] == []
    assert name not in raw_text(api.stack.engine)


async def test_a_relay_row_the_outbox_refused_is_erased_by_its_key(api: Api) -> None:
    # It made no item: the per-item erase reaches it by its key all the same.
    outbox, key = f"relay-{uuid.uuid4().hex[:8]}", "customer-42-sms"
    with Session(api.stack.engine) as session, session.begin():
        enqueue_in(
            session,
            outbox=outbox,
            destination=api.webhook.name,
            payload={"to": "+4479460000"},
            key=key,
        )
        session.execute(
            update(OUTBOX_PENDING)
            .where(OUTBOX_PENDING.c.outbox == outbox)
            .values(status=erasure.REFUSED, last_error="refused: not E.164")
        )

    erased = await api.http.delete(f"/v1/outboxes/{outbox}/items/{key}/payload")

    assert erased.status_code == 200, erased.text
    with api.stack.engine.connect() as connection:
        kept = connection.execute(
            select(OUTBOX_PENDING.c.key).where(OUTBOX_PENDING.c.outbox == outbox)
        ).all()
    assert kept == []
    again = await api.http.delete(f"/v1/outboxes/{outbox}/items/{key}/payload")
    assert assert_problem(again, 404)["code"] == "item-not-found"
