"""Scoped tokens: each route needs `read`, `enqueue` or `operate`, a token may be limited to
some outboxes, tokens are kept as SHA-256 only, and every 403 says what was missing."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from api.main import create_app
from tests.api.conftest import Api, api_settings
from tests.api.test_items import assert_problem

TOKENS = {
    "reader-token": ("reader", ["read"], None),
    "billing-token": ("billing-enqueuer", ["enqueue", "read"], ["billing"]),
    "operator-token": ("operator", ["operate", "read"], None),
}


def tokens_file(tmp_path: Path) -> Path:
    lines = []
    for token, (name, scopes, outboxes) in TOKENS.items():
        lines += [
            f"[tokens.{name}]",
            f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"',
            f"scopes = {scopes!r}".replace("'", '"'),
        ]
        if outboxes:
            lines.append(f"outboxes = {outboxes!r}".replace("'", '"'))
    path = tmp_path / "tokens.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def enqueue(api: Api, outbox: str, token: str, key: str) -> int:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": api.webhook.name, "payload": {"k": key}, "not_before": later},
        headers={**bearer(token), "Idempotency-Key": key},
    )
    return response.status_code


async def test_each_route_needs_its_scope_and_outbox(api_factory, tmp_path) -> None:
    api = await api_factory(api_token="root-token", api_tokens_file=str(tokens_file(tmp_path)))

    # Enqueue: the billing enqueuer, for billing only; the reader may not.
    assert await enqueue(api, "billing", "billing-token", "b1") == 202
    elsewhere = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {}},
        headers=bearer("billing-token"),
    )
    body = assert_problem(elsewhere, 403, "forbidden")
    assert "not allowed for outbox 'tests'" in body["detail"]
    refused = await api.http.post(
        "/v1/outboxes/billing/items",
        json={"destination": api.webhook.name, "payload": {}},
        headers=bearer("reader-token"),
    )
    body = assert_problem(refused, 403, "forbidden")
    assert body["missing_scope"] == "enqueue" and "lacks the 'enqueue' scope" in body["detail"]

    # Operate: cancelling takes `operate`, which the enqueuer lacks and the operator has.
    cancel = "/v1/outboxes/billing/items/b1/cancel"
    denied = await api.http.post(cancel, json={}, headers=bearer("billing-token"))
    assert assert_problem(denied, 403, "forbidden")["missing_scope"] == "operate"
    cancelled = await api.http.post(cancel, json={}, headers=bearer("operator-token"))
    assert cancelled.status_code == 200, cancelled.text

    # Read: everyone here reads; a token limited to outboxes reads only theirs.
    for token in ("reader-token", "operator-token", "billing-token", "root-token"):
        stats = await api.http.get("/v1/outboxes/billing/stats", headers=bearer(token))
        assert stats.status_code == 200, (token, stats.text)
    global_route = await api.http.get("/v1/aggregates", headers=bearer("billing-token"))
    assert "not an outbox's" in assert_problem(global_route, 403, "forbidden")["detail"]
    assert (await api.http.get("/v1/aggregates", headers=bearer("reader-token"))).is_success

    # What each token may do, for a client (the dashboard) to offer only that.
    who = {
        token: (await api.http.get("/v1/token", headers=bearer(token))).json()
        for token in ("billing-token", "root-token")
    }
    assert who["billing-token"] == {
        "name": "billing-enqueuer",
        "scopes": ["enqueue", "read"],
        "outboxes": ["billing"],
    }
    assert who["root-token"]["scopes"] == ["enqueue", "metrics", "operate", "read"]
    assert who["root-token"]["outboxes"] is None
    assert_problem(await api.http.get("/v1/token", headers=bearer("nope")), 403, "forbidden")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('[tokens.a]\nsha256 = "abc"\nscopes = ["read"]\n', "sha256 must be 64 hex digits"),
        (f'[tokens.a]\nsha256 = "{"0" * 64}"\nscopes = ["admin"]\n', "scopes must be"),
        (f'[tokens.a]\nsha256 = "{"0" * 64}"\nscopes = ["read"]\nrole = 1\n', "unknown field"),
        ("[users.a]\n", "expected only [tokens.<name>] tables"),
        ("not toml", "API_TOKENS_FILE"),
    ],
)
def test_a_malformed_tokens_file_stops_the_api_at_start(tmp_path, content, problem) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(content)
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace(".", r"\.")):
        create_app(api_settings(api_tokens_file=str(path)))


async def test_a_codec_session_only_for_a_token_the_codec_would_take(api_factory, tmp_path) -> None:
    api = await api_factory(api_token="root-token", api_tokens_file=str(tokens_file(tmp_path)))

    limited = await api.http.post("/v1/token/session", json={}, headers=bearer("billing-token"))
    body = assert_problem(limited, 403, "forbidden")
    assert "limited to outboxes billing" in body["detail"] and "set-cookie" not in limited.headers
    reader = await api.http.post("/v1/token/session", json={}, headers=bearer("reader-token"))
    assert reader.status_code == 204 and "outbox_session=" in reader.headers["set-cookie"]
