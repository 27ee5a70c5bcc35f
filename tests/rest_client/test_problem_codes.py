"""The REST client's exceptions carry the problem's stable `code` (the one to branch on), read
from the real API's answers; the `type` beside it links to a page the API serves."""

from __future__ import annotations

import uuid

import httpx
import pytest
from durable_outbox_rest import AsyncOutboxRest, Conflict, Gone, NotFound, Unprocessable
from durable_outbox_rest.errors import problem_error

from tests.rest_client.conftest import ServedStack


async def test_refusals_carry_their_code(served: ServedStack) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    async with AsyncOutboxRest(served.url) as rest:
        await rest.command("flight", flight, "open", {"seats": ["1A"]})
        await rest.command(
            "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="c1"
        )
        with pytest.raises(Conflict) as taken:
            await rest.command(
                "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p2"}
            )
        with pytest.raises(Conflict) as reused:
            await rest.command(
                "flight",
                flight,
                "assign_seat",
                {"seat": "1A", "passenger_id": "p3"},
                command_id="c1",
            )
        with pytest.raises(Unprocessable) as unknown_seat:
            await rest.command(
                "flight", flight, "assign_seat", {"seat": "9Z", "passenger_id": "p2"}
            )
        with pytest.raises(NotFound) as missing:
            await rest.get_item("tests", "never-enqueued")

    assert taken.value.code == "seat-taken"
    assert taken.value.type.endswith("/problems/command-conflict")  # as before codes existed
    assert reused.value.code == "idempotency-conflict"
    assert unknown_seat.value.code == "unknown-seat"
    assert missing.value.code == "item-not-found"
    async with httpx.AsyncClient(base_url=served.url) as http:
        page = await http.get(taken.value.type)
    assert page.status_code == 200 and "command-conflict" in page.text


def test_a_problem_without_code_is_named_by_its_type() -> None:
    def answer(body: dict[str, object]) -> httpx.Response:
        return httpx.Response(
            409,
            json=body,
            headers={"content-type": "application/problem+json"},
            request=httpx.Request("POST", "http://api/v1/x"),
        )

    coded = problem_error(answer({"type": "/problems/command-conflict", "code": "seat-taken"}))
    older = problem_error(answer({"type": "https://api/problems/item-failed", "title": "t"}))
    blank = problem_error(answer({"type": "about:blank", "title": "t"}))
    not_a_problem = problem_error(
        httpx.Response(
            502, text="<html>bad gateway</html>", request=httpx.Request("GET", "http://a")
        )
    )

    assert isinstance(coded, Conflict) and coded.code == "seat-taken"
    assert older.code == "item-failed"
    assert blank.code is None and not_a_problem.code is None


def test_a_pruned_item_is_gone_with_how_it_ended() -> None:
    body = {"type": "/problems/item-pruned", "code": "item-pruned", "item_status": "sent"}
    response = httpx.Response(
        410,
        json={**body, "title": "Item pruned by retention", "status": 410, "detail": "d"},
        headers={"content-type": "application/problem+json"},
        request=httpx.Request("GET", "http://api/v1/outboxes/o/items/k"),
    )

    gone = problem_error(response)

    assert isinstance(gone, Gone) and gone.code == "item-pruned"
    assert gone.body["item_status"] == "sent"
