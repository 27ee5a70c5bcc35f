"""Actors are tied to the caller's token: a command may name only an actor its token may act as,
never `system`; secret state and event fields show only to the actors a definition entitles."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path
from typing import Any

from tests.api.conftest import Api
from tests.api.test_items import assert_problem

EMAIL = {"email": "ada@example.com"}
# Token -> (name, scopes). A tokens-file token acts as its own name: `m1` is the mother.
TOKENS = {
    "m1-token": ("m1", ["enqueue", "read"]),
    "s1-token": ("s1", ["enqueue", "read"]),
    "enqueuer-token": ("enqueuer", ["enqueue", "read"]),
    "reader-token": ("reader", ["read"]),
    # A backend acting for the mother: its entry lists the actors it may act as.
    "backend-token": ("backend", ["enqueue", "read"]),
}
ACTORS = {"backend": ["m1"]}
ROOT = "root-token"


def tokens_file(tmp_path: Path) -> Path:
    lines = []
    for token, (name, scopes) in TOKENS.items():
        lines += [
            f"[tokens.{name}]",
            f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"',
            "scopes = [" + ", ".join(f'"{scope}"' for scope in scopes) + "]",
        ]
        if name in ACTORS:
            lines.append("actors = [" + ", ".join(f'"{a}"' for a in ACTORS[name]) + "]")
    path = tmp_path / "tokens.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def planned_labour(api: Api, headers: dict[str, str]) -> str:
    """A labour the mother `m1` planned, once its subscription token is set."""
    url = f"/v1/aggregates/labour/lab{uuid.uuid4().hex[:8]}"
    planned = await api.http.post(
        f"{url}/commands/plan_labour",
        json={"actor": "m1", "mother_name": "Ada", "contact": EMAIL},
        headers=headers,
    )
    assert planned.status_code == 200, planned.text
    for _ in range(200):
        effects = (await api.http.get(f"{url}/effects", headers=bearer(ROOT))).json()
        if effects and effects[0]["status"] == "done":
            return url
        await asyncio.sleep(0.05)
    raise AssertionError(f"the token was never set: {effects}")


async def command(api: Api, url: str, name: str, caller: str, payload: dict[str, Any]) -> Any:
    """Run command `name` with the bearer token `caller`."""
    return await api.http.post(f"{url}/commands/{name}", json=payload, headers=bearer(caller))


async def test_a_token_acts_only_as_itself_and_never_as_system(api_factory, tmp_path) -> None:
    api = await api_factory(api_token=ROOT, api_tokens_file=str(tokens_file(tmp_path)))
    url = await planned_labour(api, bearer("m1-token"))
    token = (await api.http.get(url, headers=bearer("m1-token"))).json()["state"][
        "subscription_token"
    ]
    access = {"actor": "s1", "token": token, "name": "Bo", "contact": EMAIL}
    asked = await command(api, url, "request_access", "s1-token", access)
    assert asked.status_code == 200, asked.text

    # The attacks of issue 31: an enqueue-only token sets the subscription token as `system`,
    # approves a subscriber and completes the labour as the mother.
    attacks = [
        ("set_subscription_token", {"actor": "system", "token": "a" * 32}, "system"),
        ("approve_subscriber", {"actor": "m1", "subscriber": "s1", "role": "birth_partner"}, "m1"),
        ("complete_labour", {"actor": "m1"}, "m1"),
    ]
    for name, payload, actor in attacks:
        refused = await command(api, url, name, "enqueuer-token", payload)
        body = assert_problem(refused, 403, "actor-not-allowed")
        assert body["actor"] == actor and "token 'enqueuer' may not act as" in body["detail"]
    # Not even the operator's API_TOKEN, nor the mother herself, may claim `system`.
    for caller in (ROOT, "m1-token"):
        system = {"actor": "system", "token": "b" * 32}
        refused = await command(api, url, "set_subscription_token", caller, system)
        assert_problem(refused, 403, "actor-not-allowed")
    # A subscriber is no mother either.
    assert_problem(await command(api, url, "complete_labour", "s1-token", {"actor": "m1"}), 403)

    view = (await api.http.get(url, headers=bearer("m1-token"))).json()
    assert view["state"]["subscription_token"] == token
    assert (
        view["state"]["status"] == "planned" and view["state"]["subscribers"]["s1"]["role"] is None
    )
    assert view["version"] == 3  # planned, token set, access requested: nothing else

    # The mother approves as herself; the events record her as the actor.
    approve = {"actor": "m1", "subscriber": "s1", "role": "observer"}
    approved = await command(api, url, "approve_subscriber", "m1-token", approve)
    assert approved.status_code == 200, approved.text
    assert [e["actor"] for e in approved.json()["events"]] == ["m1"]
    # The operator's API_TOKEN acts for anyone but the reserved actors.
    completed = await command(api, url, "complete_labour", ROOT, {"actor": "m1"})
    assert completed.status_code == 200, completed.text


async def test_the_subscription_token_is_shown_to_the_mother_only(api_factory, tmp_path) -> None:
    api = await api_factory(api_token=ROOT, api_tokens_file=str(tokens_file(tmp_path)))
    url = await planned_labour(api, bearer("m1-token"))

    async def token_seen(token: str, **params: str) -> tuple[str, str]:
        state = await api.http.get(url, params=params, headers=bearer(token))
        events = await api.http.get(f"{url}/events", params=params, headers=bearer(token))
        assert state.status_code == events.status_code == 200, (state.text, events.text)
        [token_set] = [e for e in events.json() if e["type"] == "SubscriptionTokenSet"]
        return state.json()["state"]["subscription_token"], token_set["data"]["token"]

    secret, in_event = await token_seen("m1-token")
    assert len(secret) >= 16 and secret != "[redacted]" and in_event == secret
    # A read-only token, another subscriber, the operator's token reading as nobody: redacted.
    for token in ("reader-token", "s1-token", ROOT):
        assert await token_seen(token) == ("[redacted]", "[redacted]")
    # The operator's token reads as the mother when it says so; others may not claim her.
    assert await token_seen(ROOT, actor="m1") == (secret, secret)
    refused = await api.http.get(url, params={"actor": "m1"}, headers=bearer("reader-token"))
    assert assert_problem(refused, 403, "actor-not-allowed")["actor"] == "m1"
    refused = await api.http.get(
        f"{url}/events", params={"actor": "m1"}, headers=bearer("reader-token")
    )
    assert_problem(refused, 403, "actor-not-allowed")
    # The rest of the state is there for every reader.
    view = (await api.http.get(url, headers=bearer("reader-token"))).json()
    assert view["state"]["mother"] == "m1" and view["state"]["mother_name"] == "Ada"


async def test_without_tokens_actors_are_claims_but_system_is_refused(api: Api) -> None:
    url = await planned_labour(api, {})

    refused = await api.http.post(
        f"{url}/commands/set_subscription_token", json={"actor": "system", "token": "c" * 32}
    )
    assert_problem(refused, 403, "actor-not-allowed")
    # Reading as the mother is a claim here, as every actor is without tokens (development).
    assert (await api.http.get(url)).json()["state"]["subscription_token"] == "[redacted]"
    mine = (await api.http.get(url, params={"actor": "m1"})).json()
    assert mine["state"]["subscription_token"] not in (None, "[redacted]")
    completed = await api.http.post(f"{url}/commands/complete_labour", json={"actor": "m1"})
    assert completed.status_code == 200 and completed.json()["events"][0]["actor"] == "m1"


async def test_a_command_without_an_actor_field_records_the_token(api_factory, tmp_path) -> None:
    api = await api_factory(api_token=ROOT, api_tokens_file=str(tokens_file(tmp_path)))
    opened = await api.http.post(
        f"/v1/aggregates/flight/F{uuid.uuid4().hex[:6]}/commands/open",
        json={"seats": ["1A"]},
        headers=bearer("enqueuer-token"),
    )
    assert opened.status_code == 200, opened.text
    assert [e["actor"] for e in opened.json()["events"]] == ["enqueuer"]


async def test_a_token_may_act_as_the_actors_its_entry_lists(api_factory, tmp_path) -> None:
    api = await api_factory(api_token=ROOT, api_tokens_file=str(tokens_file(tmp_path)))
    # `backend` acts for the mother: it plans her labour and reads her secret as her.
    url = await planned_labour(api, bearer("backend-token"))
    state = (await api.http.get(f"{url}?actor=m1", headers=bearer("backend-token"))).json()
    assert state["state"]["subscription_token"] != "[redacted]"
    # It may not act as anyone else, nor read as itself what only the mother may.
    refused = await command(
        api,
        url,
        "approve_subscriber",
        "backend-token",
        {"actor": "s1", "subscriber": "x", "role": "birth_partner"},
    )
    assert refused.status_code == 403, refused.text
    own = (await api.http.get(url, headers=bearer("backend-token"))).json()
    assert own["state"]["subscription_token"] == "[redacted]"
