"""Aggregates over REST: commands, state, the event store, the type's list, problems."""

from __future__ import annotations

import asyncio
import uuid

from durable_outbox_temporal.contract.aggregate import AggregateCarry, PassivateAggregate

from readmodel import aggregates as event_store
from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.workflows.test_aggregate_passivation import SEATED, T0, opened


def flight_url(flight: str, command: str = "") -> str:
    base = f"/v1/aggregates/flight/{flight}"
    return f"{base}/commands/{command}" if command else base


async def test_flight_through_the_api(api: Api) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    http = api.http

    opened = await http.post(flight_url(flight, "open"), json={"seats": ["1A", "1B", "2C"]})
    seated = await http.post(
        flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": "p1"}
    )
    moved = await http.post(
        flight_url(flight, "move_seat"), json={"passenger_id": "p1", "to": "2C"}
    )
    state = await http.get(flight_url(flight))

    assert opened.status_code == seated.status_code == moved.status_code == 200, moved.text
    assert opened.json()["version"] == 1
    assert [e["type"] for e in moved.json()["events"]] == ["SeatReleased", "SeatAssigned"]
    assert state.json()["state"]["seats"] == {"1A": None, "1B": None, "2C": "p1"}
    assert state.json()["version"] == 4
    for _ in range(50):
        events = (await http.get(f"{flight_url(flight)}/events")).json()
        if len(events) == 4:
            break
        await asyncio.sleep(0.05)
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert events[0]["actor"] == "api" and events[0]["data"] == {"seats": ["1A", "1B", "2C"]}
    later = (await http.get(f"{flight_url(flight)}/events", params={"after": 2})).json()
    assert [e["seq"] for e in later] == [3, 4]
    listed = (await http.get("/v1/aggregates/flight", params={"limit": 500})).json()
    assert {"id": flight, "version": 4} in [
        {"id": i["id"], "version": i["version"]} for i in listed["items"]
    ]


async def test_an_aggregate_whose_run_ended_idle_is_listed_and_read_from_the_store(
    api: Api,
) -> None:
    """Once Temporal forgot a run that ended idle (past the namespace's retention), what it
    stored answers: here a stored aggregate Temporal never ran."""
    flight = f"BA{uuid.uuid4().hex[:6]}"
    event_store.store_events(api.stack.engine, opened(flight))
    carry = AggregateCarry(state=SEATED, version=1, views={"assignments": 0}, updated_at=T0)
    event_store.passivate(
        api.stack.engine, PassivateAggregate("flight", flight, carry, passivated_at=T0)
    )

    state = await api.http.get(flight_url(flight))
    effects = await api.http.get(f"{flight_url(flight)}/effects")
    listed = (await api.http.get("/v1/aggregates/flight", params={"limit": 500})).json()

    assert state.status_code == 200, state.text
    assert (state.json()["version"], state.json()["state"]) == (1, SEATED)
    assert state.json()["views"] == {"assignments": 0}
    assert effects.status_code == 200 and effects.json() == []
    [summary] = [item for item in listed["items"] if item["id"] == flight]
    assert summary["passivated_at"] == "2026-11-30T09:00:00Z"
    unknown = await api.http.get(flight_url(f"BA{uuid.uuid4().hex[:6]}"))
    assert unknown.status_code == 404


async def test_commands_are_refused_with_the_right_problem(api: Api) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    http = api.http
    await http.post(flight_url(flight, "open"), json={"seats": ["1A"]})
    await http.post(flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": "p1"})

    taken = await http.post(
        flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": "p2"}
    )
    unknown_seat = await http.post(
        flight_url(flight, "assign_seat"), json={"seat": "9Z", "passenger_id": "p2"}
    )
    missing_field = await http.post(flight_url(flight, "assign_seat"), json={"seat": "1A"})
    extra_field = await http.post(flight_url(flight, "release_seat"), json={"seat": "1A", "x": 1})
    stale = await http.post(
        flight_url(flight, "release_seat"), params={"expected_version": 1}, json={"seat": "1A"}
    )

    assert "SeatTaken" in assert_problem(taken, 409)["detail"]
    assert "UnknownSeat" in assert_problem(unknown_seat, 422)["detail"]
    assert "passenger_id" in assert_problem(missing_field, 422)["detail"]
    assert "x" in assert_problem(extra_field, 422)["detail"]
    assert "expected version" in assert_problem(stale, 409)["detail"]
    assert_problem(await http.post(flight_url(flight, "board"), json={}), 404)
    assert_problem(await http.post("/v1/aggregates/ship/s1/commands/open", json={}), 404)
    assert_problem(await http.get("/v1/aggregates/ship"), 404)
    assert_problem(await http.get(flight_url("never-opened")), 404)
    assert_problem(await http.get(f"{flight_url('never-opened')}/events"), 404)
    assert_problem(await http.post(flight_url(flight, "open"), json=[1]), 422)


async def test_a_repeated_command_id_answers_the_first_outcome(api: Api) -> None:
    lock = f"lock-{uuid.uuid4().hex[:6]}"
    url = f"/v1/aggregates/lock/{lock}/commands/acquire"
    headers = {"Idempotency-Key": "acquire-1"}

    first = await api.http.post(url, json={"holder": "h1", "ttl_s": 30}, headers=headers)
    again = await api.http.post(url, json={"holder": "h1", "ttl_s": 30}, headers=headers)

    assert first.status_code == again.status_code == 200
    assert first.json()["version"] == again.json()["version"] == 1
    assert again.json()["duplicate"] is True and again.json()["events"] == []
    released = await api.http.post(
        f"/v1/aggregates/lock/{lock}/commands/release", json={"holder": "h1"}
    )
    assert [e["type"] for e in released.json()["events"]] == ["LockReleased"]


async def test_fifty_concurrent_requests_for_one_seat_get_one_200(api: Api) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    await api.http.post(flight_url(flight, "open"), json={"seats": ["1A", "1B"]})

    answers = await asyncio.gather(
        *(
            api.http.post(
                flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": f"p{n}"}
            )
            for n in range(50)
        )
    )

    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] + [409] * 49
    winner = next(a for a in answers if a.status_code == 200).json()["events"][0]["data"]
    state = (await api.http.get(flight_url(flight))).json()
    assert state["state"]["seats"]["1A"] == winner["passenger_id"] and state["version"] == 2


async def effects_of(api: Api, url: str, count: int) -> list[dict[str, object]]:
    """The ledger once it holds `count` effects, none pending."""
    for _ in range(200):
        effects = (await api.http.get(f"{url}/effects")).json()
        if len(effects) == count and all(e["status"] != "pending" for e in effects):
            return list(effects)
        await asyncio.sleep(0.05)
    raise AssertionError(f"the ledger never settled at {count}: {effects}")


async def test_labour_effects_through_the_api(api: Api) -> None:
    """The ledger over REST: statuses, a failed effect's error, an operator's retry, refusals.
    This stack has no `fake-email` destination, so the announcement's notification fails."""
    http = api.http
    url = f"/v1/aggregates/labour/lab{uuid.uuid4().hex[:6]}"
    email = {"email": "ada@example.com"}

    planned = await http.post(
        f"{url}/commands/plan_labour", json={"actor": "m1", "mother_name": "Ada", "contact": email}
    )
    [token] = await effects_of(api, url, 1)
    # The subscription token is secret: shown to the mother only (no tokens here: `?actor=`).
    state = (await http.get(url, params={"actor": "m1"})).json()
    hidden = (await http.get(url)).json()["state"]["subscription_token"]
    wrong = await http.post(
        f"{url}/commands/request_access",
        json={"actor": "s1", "token": "guess", "name": "Bo", "contact": email},
    )
    await http.post(
        f"{url}/commands/request_access",
        json={
            "actor": "s1",
            "token": state["state"]["subscription_token"],
            "name": "Bo",
            "contact": email,
        },
    )
    await http.post(
        f"{url}/commands/approve_subscriber",
        json={"actor": "m1", "subscriber": "s1", "role": "observer"},
    )
    observer = await http.post(f"{url}/commands/start_contraction", json={"actor": "s1"})
    await http.post(
        f"{url}/commands/post_update",
        json={"actor": "m1", "message": "here!", "kind": "announcement"},
    )
    effects = await effects_of(api, url, 2)

    assert planned.status_code == 200 and planned.json()["events"][0]["actor"] == "m1"
    assert hidden == "[redacted]" != state["state"]["subscription_token"]
    assert token["status"] == "done" and token["kind"] == "issue_command"
    assert_problem(wrong, 409, "command-conflict")
    assert "WrongToken" in wrong.json()["detail"]
    assert_problem(observer, 409, "command-conflict")
    failed = (await http.get(f"{url}/effects", params={"status": "failed"})).json()
    assert [e["name"] for e in failed] == ["notify.s1.email"] == [effects[1]["name"]]
    assert "UnknownDestination" in failed[0]["error"] and failed[0]["executions"] == 1
    assert (await http.get(url)).json()["effects"] == {"pending": 0, "done": 1, "failed": 1}

    retried = await http.post(f"{url}/effects/{failed[0]['key']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    [_, again] = await effects_of(api, url, 2)
    assert again["status"] == "failed" and again["executions"] == 2
    assert_problem(await http.post(f"{url}/effects/{token['key']}/retry"), 409, "effect-not-failed")
    assert_problem(await http.post(f"{url}/effects/nope/retry"), 404, "unknown-effect")
    bad_filter = await http.get(f"{url}/effects", params={"status": "lost"})
    assert bad_filter.status_code == 422
