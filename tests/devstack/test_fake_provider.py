"""The fake provider's faults and counters: tests and benchmarks trust these numbers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.item import ItemStatus
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from activities.providers.acs_email import API_VERSION, sign_request
from configuration.tls import shared_tls_context
from devstack import fake_reports
from devstack.fake_provider import (
    FakeProvider,
    FakeProviderAdmin,
    FakeProviderState,
    FaultConfig,
    command_line_parser,
    create_app,
    faults_from,
    main,
    run_fake_provider,
    with_secret,
)
from devstack.serving import serve_in_background
from tests.conftest import ACS_ACCESS_KEY, WEBHOOK_SECRET, email_destination
from tests.fakes import deliveries, submits
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


async def post_webhook(
    http: httpx.AsyncClient, url: str, key: str, **headers: str
) -> httpx.Response:
    body = b'{"n":1}'
    stamp = int(time.time())
    return await http.post(
        f"{url}/webhook/test",
        content=body,
        headers={
            "webhook-id": key,
            "webhook-timestamp": str(stamp),
            "webhook-signature": Webhook(WEBHOOK_SECRET).sign(
                key, datetime.fromtimestamp(stamp, UTC), body.decode()
            ),
            **headers,
        },
    )


async def test_a_patch_changes_only_the_faults_it_names() -> None:
    """Issue 32: a PUT replaces the whole config (a partial one turned reports off); a PATCH
    merges."""
    report_url = "http://127.0.0.1:9/events"
    async with run_fake_provider(FaultConfig(report_url=report_url)) as fake:
        merged = await fake.admin.change_faults(error_rate=0.5)
        assert merged["error_rate"] == 0.5 and merged["report_url"] == report_url
        merged = await fake.admin.change_faults(error_rate=0.0, latency_ms=20)
        assert merged["latency_ms"] == 20 and merged["report_url"] == report_url
        await fake.admin.set_faults(latency_ms=5)  # a PUT: everything else back to defaults
        async with httpx.AsyncClient() as http:
            after = (await http.get(f"{fake.url}/_admin/faults")).json()
            refused = await http.patch(f"{fake.url}/_admin/faults", json={"nope": 1})
            not_object = await http.patch(f"{fake.url}/_admin/faults", json=[1])
        assert after["report_url"] is None and after["latency_ms"] == 5
        assert refused.status_code == 422 and not_object.status_code == 422


async def test_faults_scripts_dedupe_and_counters() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        await fake.admin.set_faults(error_rate=1.0, seed=1)
        assert (await post_webhook(http, fake.url, "k1")).status_code == 503
        await fake.admin.set_faults(throttle_rate=1.0, retry_after="30", retry_after_http_date=True)
        throttled = await post_webhook(http, fake.url, "k1")
        assert throttled.status_code == 429 and "GMT" in throttled.headers["retry-after"]
        assert (await post_webhook(http, fake.url, "k1")).status_code == 429
        await fake.admin.set_faults()
        await fake.admin.script("k2", [{"status": 500}])
        assert (await post_webhook(http, fake.url, "k2")).status_code == 500
        assert (await post_webhook(http, fake.url, "k2")).status_code == 204
        assert (await post_webhook(http, fake.url, "k2")).status_code == 204

        k1 = await fake.admin.key_stats("k1")
        k2 = await fake.admin.key_stats("k2")
        totals = (await fake.admin.stats())["totals"]

    assert (k1["submits"], k1["deliveries"], k1["early_requests"]) == (3, 0, 1)
    assert (k2["submits"], k2["deliveries"]) == (3, 1)
    assert totals["duplicates"] == 0


async def test_bad_signature_is_401_and_not_a_delivery() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        response = await post_webhook(http, fake.url, "k", **{"webhook-signature": "v1,AAAA"})
        stats = await fake.admin.key_stats("k")
    assert response.status_code == 401 and stats["deliveries"] == 0


async def test_max_rate_counts_requests_in_the_busiest_window() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        for n in range(7):
            await post_webhook(http, fake.url, f"burst-{n}")
        busiest = await fake.admin.max_rate("/webhook/test", 5.0)
        elsewhere = await fake.admin.max_rate("/webhook/other", 5.0)
        await fake.admin.reset()
        after_reset = await fake.admin.max_rate("/webhook/test", 5.0)
    assert (busiest, elsewhere, after_reset) == (7, 0, 0)


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    """A private fake: these tests change its faults and reset it."""
    async with run_fake_provider() as provider:
        yield provider


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


async def post_acs(
    http: httpx.AsyncClient, url: str, key: str, recipients: tuple[str, ...] = ("ada@example.com",)
) -> httpx.Response:
    email = {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": address} for address in recipients]},
        "content": {"subject": "s", "plainText": "p"},
    }
    return await send_acs_body(http, url, key, json.dumps(email).encode())


# Each key's first-sent time per fake, so a repeat of a key is the same repeatable request. Per
# fake: a test's private fake is new, and a time kept from an earlier test's fake of this process
# could be past the window (a 412) in a long run.
_FIRST_SENT: dict[tuple[str, str], str] = {}


def repeatability_headers(key: str, url: str = "") -> dict[str, str]:
    """The repeatable-request headers ACS's SDKs send: one request id and first-sent per key."""
    return {
        "Repeatability-Request-Id": str(uuid.uuid5(uuid.NAMESPACE_URL, key)),
        "Repeatability-First-Sent": _FIRST_SENT.setdefault((url, key), formatdate(usegmt=True)),
    }


async def send_acs_body(
    http: httpx.AsyncClient, url: str, key: str, body: bytes, access_key: str = ACS_ACCESS_KEY
) -> httpx.Response:
    """POST `body` as a repeatable send-email request, signed with `access_key`."""
    request = http.build_request(
        "POST",
        f"{url}/emails:send",
        params={"api-version": API_VERSION},
        content=body,
        headers={
            "Content-Type": "application/json",
            "Operation-Id": key,
            **repeatability_headers(key, url),
        },
    )
    sign_request(request, access_key)
    return await http.send(request)


async def poll_acs(http: httpx.AsyncClient, accepted: httpx.Response) -> str:
    """The status the accepted send's operation answers now."""
    request = http.build_request("GET", accepted.headers["Operation-Location"])
    sign_request(request, ACS_ACCESS_KEY)
    return str((await http.send(request)).json()["status"])


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait for something a background task does (reports go out on their own time)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "still not the case"
        await asyncio.sleep(0.02)


@dataclass
class Receiver:
    """An Event Grid subscriber: records every POST, answers `answers` first and 200 after."""

    url: str = ""
    answers: list[int] = field(default_factory=list)
    posts: list[tuple[dict[str, str], Any]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def report_receiver(*answers: int) -> AsyncIterator[Receiver]:
    receiver = Receiver(answers=list(answers))

    async def record(request: Request) -> Response:
        receiver.posts.append((dict(request.headers), json.loads(await request.body())))
        return Response(status_code=receiver.answers.pop(0) if receiver.answers else 200)

    app = Starlette(routes=[Route("/events", record, methods=["POST"])])
    async with serve_in_background(app) as url:
        receiver.url = f"{url}/events?secret=s3cret"
        yield receiver


async def test_error_rate_one_makes_every_submit_503_and_resets_cleanly(fake, http) -> None:
    await fake.admin.set_faults(error_rate=1.0)
    failed = [await post_acs(http, fake.url, "e1"), await post_webhook(http, fake.url, "e2")]

    await fake.admin.set_faults()
    recovered = [await post_acs(http, fake.url, "e1"), await post_webhook(http, fake.url, "e2")]

    assert [r.status_code for r in failed] == [503, 503]
    assert [r.status_code for r in recovered] == [202, 204]
    assert fake.state.faults == FaultConfig()
    assert (await fake.admin.stats())["totals"]["deliveries"] == 2


async def test_throttle_with_http_date_retry_after(fake, http) -> None:
    await fake.admin.set_faults(throttle_rate=1.0, retry_after="30", retry_after_http_date=True)

    response = await post_webhook(http, fake.url, "t1")

    assert response.status_code == 429
    when = parsedate_to_datetime(response.headers["Retry-After"])
    remaining = (when - datetime.now(UTC)).total_seconds()
    assert 28.0 <= remaining <= 31.0
    assert (await fake.admin.key_stats("t1"))["deliveries"] == 0


async def test_scripted_503_then_success(fake, http) -> None:
    await fake.admin.script("s1", [{"status": 503}, {}])

    statuses = [(await post_webhook(http, fake.url, "s1")).status_code for _ in range(3)]

    assert statuses == [503, 204, 204]
    stats = await fake.admin.key_stats("s1")
    assert (stats["submits"], stats["deliveries"]) == (3, 1)


async def test_request_before_retry_after_elapsed_is_counted_early(fake, http) -> None:
    await fake.admin.script("early", [{"status": 429, "retry_after": "30"}])
    await fake.admin.script("patient", [{"status": 429, "retry_after": "0"}])

    for key in ("early", "patient"):
        assert (await post_webhook(http, fake.url, key)).status_code == 429
        assert (await post_webhook(http, fake.url, key)).status_code == 204

    assert (await fake.admin.key_stats("early"))["early_requests"] == 1
    assert (await fake.admin.key_stats("patient"))["early_requests"] == 0
    assert (await fake.admin.stats())["totals"]["early_requests"] == 1


async def test_max_rate_counts_a_burst_by_prefix_and_window(fake, http) -> None:
    for n in range(5):
        await post_webhook(http, fake.url, f"burst-{n}")
    await asyncio.sleep(0.3)
    for n in range(3):
        await post_webhook(http, fake.url, f"later-{n}")
    assert await fake.admin.max_rate("/webhook/test", 10.0) == 8
    assert await fake.admin.max_rate("/emails", 10.0) == 0
    # The windows on times of the test's own: as posted, a burst's spacing is the machine's (a
    # loaded one spread five posts over more than 0.2 s). Five 10 ms apart, three half a second on.
    posted = [path for _, path in fake.state.requests]
    assert len(posted) == 8
    fake.state.requests[:] = [
        (1_000.0 + 0.01 * n + (0.5 if n >= 5 else 0.0), path) for n, path in enumerate(posted)
    ]

    assert await fake.admin.max_rate("/webhook/test", 0.2) == 5
    assert await fake.admin.max_rate("/webhook/test", 0.6) == 8
    assert await fake.admin.max_rate("/webhook/test", 0.025) == 3


async def test_deduped_repeats_are_not_duplicates(fake, http) -> None:
    for _ in range(3):
        assert (await post_webhook(http, fake.url, "w")).status_code == 204
    first, second = await post_acs(http, fake.url, "a"), await post_acs(http, fake.url, "a")

    totals = (await fake.admin.stats())["totals"]

    assert first.headers["Operation-Location"] == second.headers["Operation-Location"]
    assert (totals["submits"], totals["deliveries"], totals["duplicates"]) == (5, 2, 0)


async def test_reset_clears_counters_scripts_and_operations(fake, http) -> None:
    accepted = await post_acs(http, fake.url, "r1")
    await fake.admin.script("r2", [{"status": 500}])

    await fake.admin.reset()

    totals = (await fake.admin.stats())["totals"]
    assert totals == {
        "requests": 0,
        "submits": 0,
        "deliveries": 0,
        "duplicates": 0,
        "early_requests": 0,
        "reports_sent": 0,
        "report_failures": 0,
        "hidden_limit_refused": 0,
    }
    assert (await post_webhook(http, fake.url, "r2")).status_code == 204
    poll = http.build_request("GET", accepted.headers["Operation-Location"])
    sign_request(poll, ACS_ACCESS_KEY)
    assert (await http.send(poll)).status_code == 404


def test_every_fault_field_is_a_flag_of_its_type() -> None:
    parser = command_line_parser()
    args = parser.parse_args(
        ["--error-rate", "0.5", "--retry-after-http-date", "--running-polls", "4"]
        + ["--poll-retry-after", "2", "--seed", "7", "--port", "9"]
    )

    reports = parser.parse_args(
        ["--report-url", "http://r/events?secret=s", "--report-schema", "cloudevents"]
        + ["--report-delay-s", "0.5", "--bounce-rate", "0.25", "--duplicate-reports"]
    )

    assert faults_from(args) == FaultConfig(
        error_rate=0.5, retry_after_http_date=True, running_polls=4, poll_retry_after="2", seed=7
    )
    assert faults_from(reports) == FaultConfig(
        report_url="http://r/events?secret=s",
        report_schema="cloudevents",
        report_delay_s=0.5,
        bounce_rate=0.25,
        duplicate_reports=True,
    )
    assert faults_from(parser.parse_args([])) == FaultConfig()
    assert args.port == 9
    usage = parser.format_help()
    for fault in dataclasses.fields(FaultConfig):
        assert f"--{fault.name.replace('_', '-')}" in usage, fault.name


async def test_the_command_starts_with_the_faults_its_flags_give() -> None:
    port = free_port()
    command = [sys.executable, "-m", "devstack.fake_provider", "--port", str(port)]
    # Its default secrets, which the test signs with, whatever the shell exports.
    env = {name: value for name, value in os.environ.items() if not name.startswith("FAKE_")}
    process = await asyncio.create_subprocess_exec(
        *command, "--throttle-rate", "1", "--retry-after", "9", cwd=ROOT, env=env
    )
    try:
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    faults = (await http.get(f"http://127.0.0.1:{port}/_admin/faults")).json()
                    break
                except httpx.TransportError:
                    assert process.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            throttled = await post_webhook(http, f"http://127.0.0.1:{port}", "cli")
    finally:
        process.terminate()
        await process.wait()

    assert faults == dataclasses.asdict(FaultConfig(throttle_rate=1.0, retry_after="9"))
    assert throttled.status_code == 429 and throttled.headers["retry-after"] == "9"


async def test_the_command_reports_with_the_events_secret_from_its_environment(http) -> None:
    """`ps` shows a command line: the secret comes from FAKE_EMAIL_EVENTS_SECRET instead, and
    reaches the report URL's `secret=` all the same."""
    queries: list[str] = []

    async def record(request: Request) -> Response:
        queries.append(request.url.query)
        return Response(status_code=200)

    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("FAKE_")}
    env["FAKE_EMAIL_EVENTS_SECRET"] = "from-the-environment-only"
    receiver = Starlette(routes=[Route("/events", record, methods=["POST"])])
    async with serve_in_background(receiver) as receiver_url:
        command = [sys.executable, "-m", "devstack.fake_provider", "--port", str(port)]
        flags = ["--report-url", f"{receiver_url}/events", "--report-delay-s", "0"]
        process = await asyncio.create_subprocess_exec(*command, *flags, cwd=ROOT, env=env)
        try:
            fake_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while True:
                try:
                    await http.get(f"{fake_url}/_admin/stats")
                    break
                except httpx.TransportError:
                    assert process.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
            await poll_acs(http, await post_acs(http, fake_url, "env", ("ada@example.com",)))
            await eventually(lambda: len(queries) >= 1)
        finally:
            process.terminate()
            await process.wait()

    assert "from-the-environment-only" not in cmdline
    assert queries[0] == "secret=from-the-environment-only"


def test_a_report_url_with_its_own_secret_keeps_it() -> None:
    assert with_secret("http://a/events?x=1", "s") == "http://a/events?x=1&secret=s"
    assert with_secret("http://a/events?secret=mine", "s") == "http://a/events?secret=mine"
    assert with_secret("http://a/events", None) == "http://a/events"


def test_an_unknown_report_schema_flag_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--report-schema", "xml"])

    assert exited.value.code == 2
    assert "report_schema must be one of eventgrid, cloudevents" in capsys.readouterr().err


async def test_a_deduped_submit_and_later_polls_send_no_more_reports(http) -> None:
    async with (
        report_receiver() as receiver,
        run_fake_provider(
            FaultConfig(
                report_url=receiver.url,
                report_delay_s=0,
                report_before_success=True,
                running_polls=1,
            )
        ) as fake,
    ):
        first = await post_acs(http, fake.url, "once", ("ada@example.com",))
        again = await post_acs(http, fake.url, "once", ("ada@example.com",))
        statuses = [await poll_acs(http, first) for _ in range(3)]
        await eventually(lambda: len(receiver.posts) >= 1)
        await asyncio.sleep(0.2)  # room for a second POST, were one on its way
        totals = (await fake.admin.stats())["totals"]

    assert again.status_code == 202 and statuses == ["Running", "Succeeded", "Succeeded"]
    assert [len(body) for _, body in receiver.posts] == [1]
    assert totals["reports_sent"] == 1


async def test_reset_and_shutdown_cancel_reports_not_yet_sent(http) -> None:
    async with report_receiver() as receiver:
        faults = FaultConfig(report_url=receiver.url, report_delay_s=0.2)
        state = FakeProviderState(ACS_ACCESS_KEY, WEBHOOK_SECRET, faults)
        # With its lifespan, as `python -m devstack.fake_provider` serves it.
        async with serve_in_background(create_app(state), lifespan="on") as url:
            await poll_acs(http, await post_acs(http, url, "before-reset", ("ada@example.com",)))
            await FakeProviderAdmin(url).reset()
            await asyncio.sleep(0.3)  # past the reports' delay
            after_reset = list(receiver.posts)
            await poll_acs(http, await post_acs(http, url, "at-shutdown", ("bob@example.com",)))
        await asyncio.sleep(0.3)

    assert after_reset == [] and receiver.posts == []
    assert state.reports.sent == 0


async def test_a_seeded_bounce_rate_bounces_the_same_recipients_after_a_reset(http) -> None:
    recipients = tuple(f"user{n}@example.com" for n in range(16))
    async with (
        report_receiver() as receiver,
        run_fake_provider(
            FaultConfig(report_url=receiver.url, report_delay_s=0, bounce_rate=0.5, seed=11)
        ) as fake,
    ):

        async def bounced_in_a_fresh_run() -> set[str]:
            posted = len(receiver.posts)
            await poll_acs(http, await post_acs(http, fake.url, "rate", recipients))
            await eventually(lambda: len(receiver.posts) > posted)
            await fake.admin.reset()  # re-seeds the draws and forgets operation "rate"
            _, events = receiver.posts[posted]
            return {e["data"]["recipient"] for e in events if e["data"]["status"] == "Bounced"}

        first, second = await bounced_in_a_fresh_run(), await bounced_in_a_fresh_run()

    assert first == second
    assert 0 < len(first) < len(recipients)


async def test_a_receiver_that_keeps_failing_gets_five_tries_then_a_counted_failure(
    http, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The schedule's shape (each wait twice the one before), a hundred times quicker.
    monkeypatch.setattr(fake_reports, "RETRY_DELAY_S", 0.005)
    async with (
        report_receiver(500, 500, 500, 500, 500) as receiver,
        run_fake_provider(FaultConfig(report_url=receiver.url, report_delay_s=0)) as fake,
    ):
        await poll_acs(http, await post_acs(http, fake.url, "refused", ("ada@example.com",)))
        await eventually(lambda: fake.state.reports.failures > 0)
        totals = (await fake.admin.stats())["totals"]

    assert [headers["aeg-delivery-count"] for headers, _ in receiver.posts] == [
        "0",
        "1",
        "2",
        "3",
        "4",
    ]
    assert receiver.posts[0][1] == receiver.posts[2][1]  # a retry resends the same events
    assert (totals["reports_sent"], totals["report_failures"]) == (0, 1)


async def test_deliveries_are_listed_in_arrival_order_per_endpoint(fake, http) -> None:
    assert (await post_webhook(http, fake.url, "w1")).status_code == 204
    assert (await post_acs(http, fake.url, "e1")).status_code == 202
    assert (await post_webhook(http, fake.url, "w2")).status_code == 204
    assert (await post_webhook(http, fake.url, "w1")).status_code == 204  # a duplicate

    everything = await fake.admin.deliveries()
    webhooks = await fake.admin.deliveries("test")

    assert [(d["seq"], d["key"], d["endpoint"]) for d in everything] == [
        (1, "w1", "test"),
        (2, "e1", "emails"),
        (3, "w2", "test"),
    ]
    assert [d["key"] for d in webhooks] == ["w1", "w2"]
    assert webhooks[0]["payload"] == {"n": 1}
    await fake.admin.reset()
    assert await fake.admin.deliveries() == []


MINIMAL_EMAIL: dict[str, Any] = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi Ada"},
}


def email_with(**changes: Any) -> bytes:
    """MINIMAL_EMAIL with top-level fields replaced (a value of None removes the field)."""
    email = {**MINIMAL_EMAIL, **changes}
    return json.dumps({name: value for name, value in email.items() if value is not None}).encode()


def content_with(**changes: Any) -> bytes:
    content = {**MINIMAL_EMAIL["content"], **changes}
    return email_with(content={name: value for name, value in content.items() if value is not None})


ATTACHMENT = {"name": "a.txt", "contentType": "text/plain", "contentInBase64": "aGk="}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "JSON"),
        (b"[]", "JSON object"),
        (email_with(senderAddress=None), "senderAddress"),
        (email_with(senderAddress=7), "senderAddress"),
        (email_with(senderAddress=""), "senderAddress"),
        (email_with(recipients=None), "recipients"),
        (email_with(recipients=["ada@example.com"]), "recipients"),
        (email_with(recipients={}), "recipients"),
        (email_with(recipients={"to": [], "cc": [], "bcc": []}), "recipients"),
        (email_with(recipients={"to": "ada@example.com"}), "recipients.to"),
        (email_with(recipients={"to": ["ada@example.com"]}), "recipients.to[0].address"),
        (email_with(recipients={"cc": [{"displayName": "Ada"}]}), "recipients.cc[0].address"),
        (email_with(recipients={"bcc": [{"address": ""}]}), "recipients.bcc[0].address"),
        (
            email_with(recipients={"to": [{"address": "a@example.com", "displayName": 1}]}),
            "recipients.to[0].displayName",
        ),
        (
            email_with(
                recipients={
                    "to": [{"address": f"to{n}@example.com"} for n in range(30)],
                    "bcc": [{"address": f"bcc{n}@example.com"} for n in range(21)],
                }
            ),
            "at most 50",
        ),
        (email_with(content=None), "content"),
        (email_with(content="Hi"), "content"),
        (content_with(subject=None), "content.subject"),
        (content_with(subject=""), "content.subject"),
        (content_with(plainText=None), "content.plainText or content.html"),
        (content_with(plainText="", html=""), "content.plainText or content.html"),
        (content_with(html=["<p>Hi</p>"]), "content.html"),
        (email_with(attachments={"name": "a.txt"}), "attachments"),
        (email_with(attachments=["a.txt"]), "attachments[0]"),
        (email_with(attachments=[{**ATTACHMENT, "name": None}]), "attachments[0].name"),
        (
            email_with(attachments=[ATTACHMENT, {**ATTACHMENT, "contentType": ""}]),
            "attachments[1].contentType",
        ),
        (
            email_with(attachments=[{"name": "a.txt", "contentType": "text/plain"}]),
            "contentInBase64",
        ),
    ],
)
async def test_a_send_the_real_service_would_refuse_is_a_400_naming_the_field(
    fake, http, body: bytes, field: str
) -> None:
    await fake.admin.set_faults(error_rate=1.0)  # the body is checked before any fault

    response = await send_acs_body(http, fake.url, "bad", body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "BadRequest" and field in error["message"]
    assert await fake.admin.deliveries("emails") == []


@pytest.mark.parametrize(
    "body",
    [
        email_with(),
        email_with(recipients={"bcc": [{"address": "audit@example.com"}]}),
        email_with(
            recipients={"to": [{"address": f"to{n}@example.com"} for n in range(50)]},
            content={"subject": "Hello", "html": "<p>Hi</p>"},
        ),
        email_with(
            senderAddress="DoNotReply@example.com",
            recipients={
                "to": [{"address": "ada@example.com", "displayName": "Ada"}],
                "cc": [{"address": "bob@example.com", "displayName": "Bob"}],
                "bcc": [{"address": "audit@example.com"}],
            },
            content={"subject": "Hello", "plainText": "Hi", "html": "<p>Hi</p>"},
            attachments=[ATTACHMENT],
            replyTo=[{"address": "support@example.com", "displayName": "Support"}],
            headers={"x-order": "42"},
            userEngagementTrackingDisabled=True,
        ),
    ],
    ids=["minimal", "bcc-only", "fifty-recipients-html", "full"],
)
async def test_a_valid_send_is_accepted(fake, http, body: bytes) -> None:
    response = await send_acs_body(http, fake.url, "good", body)

    assert response.status_code == 202
    assert [d["key"] for d in await fake.admin.deliveries("emails")] == ["good"]


async def test_a_bad_signature_is_401_before_the_body_is_checked(fake, http) -> None:
    wrong_key = base64.b64encode(b"some-other-key").decode()

    invalid = await send_acs_body(http, fake.url, "k", b"not json", access_key=wrong_key)
    valid = await send_acs_body(http, fake.url, "k", email_with(), access_key=wrong_key)

    assert (invalid.status_code, valid.status_code) == (401, 401)
    assert invalid.json()["error"]["code"] == "Denied"


async def test_an_item_whose_email_the_service_would_refuse_fails_at_once_naming_the_field(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    no_subject = {**MINIMAL_EMAIL, "content": {"plainText": "Hi Ada"}}

    item = await stack.enqueue(destination, no_subject)
    failure = await stack.failure(item.item_id)

    assert failure.type == "PermanentDeliveryError"
    view = await stack.outbox.status("tests", item.key)
    assert view.status is ItemStatus.FAILED and view.attempts == 1
    assert view.last_error and "HTTP 400" in view.last_error
    assert "content.subject" in view.last_error
    assert await submits(fake_provider, item.item_id) == 1
    assert await deliveries(fake_provider, item.item_id) == 0


async def test_a_hidden_limit_admits_its_rate_and_answers_429_above_it(fake, http) -> None:
    """An endpoint's hidden limit (what the adaptive rate's tests learn): a bucket of a second's
    worth, refilled at the limit; above it a 429 with Retry-After; cleared, none."""
    await fake.admin.set_hidden_limit("test", 3.0)
    try:
        answers = [(await post_webhook(http, fake.url, f"h{n}")).status_code for n in range(5)]
        assert answers == [204, 204, 204, 429, 429]
        refused = await post_webhook(http, fake.url, "h5")
        assert refused.headers["retry-after"] == "1"
        await asyncio.sleep(0.4)  # a token back at 3 a second
        assert (await post_webhook(http, fake.url, "h6")).status_code == 204
        totals = (await fake.admin.stats())["totals"]
        assert totals["hidden_limit_refused"] == 3
    finally:
        await fake.admin.clear_hidden_limit("test")
    assert (await post_webhook(http, fake.url, "h7")).status_code == 204
    bad = await http.put(f"{fake.url}/_admin/limits/test", json={"limit": -1})
    assert bad.status_code == 422


async def test_a_caller_hanging_up_mid_body_is_not_recorded_or_logged_as_an_error(http) -> None:
    # A worker SIGKILLed while it sent a webhook: the body never fully arrived.
    state = FakeProviderState(ACS_ACCESS_KEY, WEBHOOK_SECRET, FaultConfig())
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    server_log = logging.getLogger("uvicorn.error")  # uvicorn's own: it does not propagate
    async with serve_in_background(create_app(state)) as url:
        server_log.addHandler(handler)
        try:
            host, port = url.removeprefix("http://").split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /webhook/hung-up HTTP/1.1\r\nHost: fake\r\nwebhook-id: msg_1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"partial":'
            )
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.2)
            stats = await FakeProviderAdmin(url).stats()
        finally:
            server_log.removeHandler(handler)

    assert stats["totals"].get("submits", 0) == 0
    assert errors == [], [record.getMessage() for record in errors]
