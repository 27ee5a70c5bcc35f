"""Every problem the API answers carries a stable `code` and a `type` URI whose page the API
serves; every code is listed once, with its status, in `api/problem_codes.py` and has its
section in docs/reference/problems.md."""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from api.errors import _OUTBOX_ERRORS
from api.main import create_app
from api.problem_codes import PROBLEM_CODES, SECTIONS, STATUS_CODES, domain_code
from configuration.settings import PROJECT_ROOT
from devstack.reference_docs import REFERENCE_DIR
from tests.api.conftest import Api, api_settings
from tests.api.test_items import assert_problem

TOKEN = "s3cret"
_CODE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def test_every_code_has_its_section_in_the_reference() -> None:
    page = (REFERENCE_DIR / "problems.md").read_text()

    sections = re.findall(r"^### `([^`]+)`$", page, re.MULTILINE)

    assert sorted(sections) == sorted(PROBLEM_CODES)


def test_codes_are_unique_and_a_refinement_keeps_its_kinds_status() -> None:
    listed = [problem.code for problem in (p for s in SECTIONS.values() for p in s)]

    assert len(listed) == len(set(listed))
    for problem in PROBLEM_CODES.values():
        assert _CODE.fullmatch(problem.code), problem.code
        assert problem.meaning and problem.remedy
        if problem.refines is not None:
            assert PROBLEM_CODES[problem.refines].status == problem.status, problem


def test_each_aggregates_own_refusal_is_a_code() -> None:
    assert domain_code("SeatTaken") == "seat-taken"
    assert domain_code("HTTPBodyTooLarge") == "http-body-too-large"
    taken = PROBLEM_CODES["seat-taken"]
    assert (taken.status, taken.refines) == (409, "command-conflict")
    assert (PROBLEM_CODES["unknown-seat"].status, PROBLEM_CODES["unknown-seat"].refines) == (
        422,
        "invalid-command",
    )


def test_the_general_and_the_client_errors_codes_are_listed_with_their_status() -> None:
    for status, code in STATUS_CODES.items():
        assert PROBLEM_CODES[code].status == status, code
    for status, code, _ in _OUTBOX_ERRORS.values():
        assert PROBLEM_CODES[code].status == status, code


def _problem_raise_sites() -> Iterator[tuple[str, int, int, str]]:
    """Each `ApiProblem(<status>, "<code>", ...)` written in the API's source."""
    for path in sorted((PROJECT_ROOT / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            status, code = node.args[0], node.args[1]
            if (
                name == "ApiProblem"
                and isinstance(status, ast.Constant)
                and isinstance(status.value, int)
                and isinstance(code, ast.Constant)
                and isinstance(code.value, str)
            ):
                where = str(Path(path).relative_to(PROJECT_ROOT))
                yield where, node.lineno, status.value, code.value


def test_every_problem_raised_in_the_api_has_a_listed_code_of_its_status() -> None:
    sites = list(_problem_raise_sites())

    assert len(sites) > 20  # the scan sees them
    for where, line, status, code in sites:
        if code == "about:blank":
            continue
        assert code in PROBLEM_CODES, f"{where}:{line}: add {code!r} to api/problem_codes.py"
        assert PROBLEM_CODES[code].status == status, f"{where}:{line}: {code} is not {status}"


def test_the_openapi_schema_declares_code_and_type_on_every_problem() -> None:
    schema = create_app(api_settings()).openapi()
    problem = schema["components"]["schemas"]["Problem"]
    statuses = {problem.status for problem in PROBLEM_CODES.values()}

    assert {"type", "code"} <= set(problem["required"])
    declared = [
        int(status)
        for operations in schema["paths"].values()
        for operation in operations.values()
        for status, response in operation.get("responses", {}).items()
        if "application/problem+json" in response.get("content", {})
    ]
    assert declared
    assert set(declared) <= statuses  # each declared status has its codes


@pytest_asyncio.fixture(loop_scope="session")
async def bare_api() -> AsyncIterator[httpx.AsyncClient]:
    """The app without its lifespan: what it answers before a route needs Temporal."""
    app = create_app(api_settings(api_token=TOKEN, max_request_bytes=2000, allowed_hosts="api"))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        yield http


async def test_answers_before_any_route_carry_a_code_whose_page_resolves(
    bare_api: httpx.AsyncClient,
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    items = "/v1/outboxes/tests/items"
    answers = {
        "not-found": await bare_api.get("/nowhere"),
        "method-not-allowed": await bare_api.delete("/problems"),
        "unauthorized": await bare_api.get("/v1/destinations"),
        "forbidden": await bare_api.get(
            "/v1/destinations", headers={"Authorization": "Bearer wrong"}
        ),
        "malformed-json": await bare_api.post(
            items, content=b"{", headers={**bearer, "Content-Type": "application/json"}
        ),
        "unsupported-media-type": await bare_api.post(
            items, content=b"{}", headers={**bearer, "Content-Type": "text/plain"}
        ),
        "request-too-large": await bare_api.post(items, json={"pad": "x" * 3000}, headers=bearer),
        "too-deeply-nested": await bare_api.post(
            items, content=b"[" * 100 + b"]" * 100, headers=bearer
        ),
        "invalid-host": await bare_api.get("/healthz", headers={"Host": "elsewhere"}),
    }

    for code, answer in answers.items():
        body = answer.json()
        assert answer.headers["content-type"] == "application/problem+json", code
        assert (body["code"], body["status"]) == (code, PROBLEM_CODES[code].status), body
        assert body["type"] == f"/problems/{code}" and body["title"] and body["detail"]
        page = await bare_api.get(body["type"])
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert f"<h1><code>{code}</code></h1>" in page.text


async def test_every_codes_page_is_served_without_a_token(bare_api: httpx.AsyncClient) -> None:
    index = await bare_api.get("/problems")
    unknown = await bare_api.get("/problems/no-such-code")
    refined = await bare_api.get("/problems/seat-taken")

    assert index.status_code == 200
    for code in PROBLEM_CODES:
        assert f'href="problems/{code}"' in index.text
    assert_problem(unknown, 404, "/problems/not-found")
    assert "Another passenger already holds the seat" in refined.text
    assert 'href="command-conflict"' in refined.text


async def test_the_type_is_absolute_under_the_public_base_url() -> None:
    app = create_app(
        api_settings(public_base_url="https://outbox.example.com/", max_request_bytes=2000)
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        answers = [
            await http.get("/nowhere"),
            # Answered by the middlewares, before any route.
            await http.post("/v1/outboxes/tests/items", json={"pad": "x" * 3000}),
            await http.post("/v1/outboxes/tests/items", content=b"[" * 100 + b"]" * 100),
        ]

    assert [answer.json()["type"] for answer in answers] == [
        "https://outbox.example.com/problems/not-found",
        "https://outbox.example.com/problems/request-too-large",
        "https://outbox.example.com/problems/too-deeply-nested",
    ]


async def test_the_type_keeps_a_proxys_path_prefix() -> None:
    app = create_app(api_settings())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, root_path="/outbox")
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        answer = await http.get("/outbox/nowhere")

    assert answer.json()["type"] == "/outbox/problems/not-found"


def flight_command(flight: str, command: str) -> str:
    return f"/v1/aggregates/flight/{flight}/commands/{command}"


async def test_an_aggregates_refusal_is_coded_by_its_reason_and_keeps_its_type(api: Api) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    http = api.http
    await http.post(flight_command(flight, "open"), json={"seats": ["1A"]})
    await http.post(
        flight_command(flight, "assign_seat"), json={"seat": "1A", "passenger_id": "p1"}
    )

    answers: dict[str, Any] = {
        "seat-taken": await http.post(
            flight_command(flight, "assign_seat"), json={"seat": "1A", "passenger_id": "p2"}
        ),
        "unknown-seat": await http.post(
            flight_command(flight, "assign_seat"), json={"seat": "9Z", "passenger_id": "p2"}
        ),
        "version-conflict": await http.post(
            flight_command(flight, "release_seat"),
            params={"expected_version": 1},
            json={"seat": "1A"},
        ),
        "flight-already-open": await http.post(
            flight_command(flight, "open"), json={"seats": ["1A"]}
        ),
        "unknown-command": await http.post(flight_command(flight, "board"), json={}),
        "invalid-request": await http.post(flight_command(flight, "assign_seat"), json={}),
    }

    for code, answer in answers.items():
        listed = PROBLEM_CODES[code]
        body = assert_problem(answer, listed.status or 0, f"/problems/{listed.type_code}")
        assert body["code"] == code, body
    assert answers["seat-taken"].json()["type"] == "/problems/command-conflict"
    assert answers["unknown-seat"].json()["type"] == "/problems/invalid-command"
