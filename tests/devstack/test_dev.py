"""`make dev` end to end: the stack starts, delivers, stops on Ctrl-C, keeps its items, and brings
back a process that dies."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id
from temporalio.client import Client, WorkflowExecutionStatus

from devstack.dev import Child, RestartBackoff, build_children, start, stop, supervise
from devstack.fake_provider import command_line_parser
from tests.devstack.stack import DevStack, port_in_use


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie has exited; only its parent's wait() is missing.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def wait_for(condition: Callable[[], bool], timeout_s: float, explain: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, explain()
        time.sleep(0.2)


def assert_email_reports_arrive(stack: DevStack, http: httpx.Client) -> None:
    """An email ends `sent`, then its recipients `delivered` and `bounced`, from the fake
    provider's Event Grid reports to the API (the secret `make dev` wires on both sides)."""
    events = f"{stack.api}/v1/destinations/fake-email/events"
    handshake = http.options(
        events,
        params={"secret": "dev-events-secret"},
        headers={"WebHook-Request-Origin": "eventgrid.azure.net"},
    )
    assert handshake.headers.get("WebHook-Allowed-Origin") == "eventgrid.azure.net"
    assert http.post(events, params={"secret": "wrong"}, json=[]).status_code == 401
    enqueued = http.post(
        f"{stack.api}/v1/outboxes/demo/items",
        headers={"Idempotency-Key": "dev-email"},
        json={
            "destination": "fake-email",
            "payload": {
                "senderAddress": "noreply@example.com",
                "recipients": {
                    "to": [{"address": "ada@example.com"}, {"address": "bounce@example.com"}]
                },
                "content": {"subject": "Welcome", "plainText": "Hi"},
            },
        },
    )
    assert enqueued.status_code == 202, enqueued.text
    deadline = time.monotonic() + 60
    while True:
        item = http.get(f"{stack.api}/v1/outboxes/demo/items/dev-email").json()
        recipients = {r["address"]: r["status"] for r in item.get("recipients", [])}
        if recipients == {"ada@example.com": "delivered", "bounce@example.com": "bounced"}:
            break
        assert time.monotonic() < deadline, f"{item}\n{stack.output()}"
        time.sleep(0.3)
    assert item["status"] == "sent" and item["delivery"] == "bounced"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DevStack]:
    stack = DevStack(tmp_path / "data")
    yield stack
    if stack.process is not None and stack.process.poll() is None:
        stack.process.send_signal(signal.SIGTERM)
        stack.wait()


async def describe_status(address: str, workflow_id: str) -> WorkflowExecutionStatus | None:
    client = await Client.connect(address)
    return (await client.get_workflow_handle(workflow_id).describe()).status


@pytest.mark.timeout(300)
def test_make_dev_delivers_stops_restarts_with_its_items_and_brings_back_the_killed(
    stack: DevStack,
) -> None:
    stack.start()
    banner = stack.output()
    assert f"API               {stack.api}" in banner and "OPEN: no API_TOKEN" in banner
    assert f"{stack.api}/docs" in banner and f"Fake provider     {stack.fake}" in banner
    assert f"http://127.0.0.1:{stack.ports['DEV_UI_PORT']}" in banner
    assert any(line.startswith("  worker | ") for line in stack.lines)  # prefixed output

    with httpx.Client(timeout=10) as http:
        assert http.get(f"http://127.0.0.1:{stack.ports['DEV_UI_PORT']}/").status_code == 200
        enqueued = http.post(
            f"{stack.api}/v1/outboxes/demo/items",
            headers={"Idempotency-Key": "dev-1"},
            json={"destination": "fake-webhook", "payload": {"hello": "world"}},
        )
        assert enqueued.status_code == 202, enqueued.text
        deadline = time.monotonic() + 60
        while http.get(f"{stack.api}/v1/outboxes/demo/items/dev-1").json()["status"] != "sent":
            assert time.monotonic() < deadline, stack.output()
            time.sleep(0.3)
        assert http.get(f"{stack.fake}/_admin/stats").json()["totals"]["deliveries"] == 1
        assert_email_reports_arrive(stack, http)

    children = stack.children()
    assert set(children) == {"temporal", "fake", "worker", "api"}
    assert stack.process is not None
    stack.process.send_signal(signal.SIGINT)
    assert stack.wait() == 0, stack.output()
    assert all(gone(pid) for pid in children.values()), stack.output()
    assert not any(port_in_use(port) for port in stack.ports.values())

    stack.start()
    with httpx.Client(timeout=10) as http:
        item = http.get(f"{stack.api}/v1/outboxes/demo/items/dev-1").json()
        assert item["status"] == "sent"
    status = asyncio.run(describe_status(stack.temporal, item_workflow_id("demo", "dev-1")))
    assert status == WorkflowExecutionStatus.COMPLETED

    # A developer kills the worker and the API to watch recovery: both come back, nothing else
    # restarts, and an item enqueued afterwards is delivered.
    before = stack.children()
    os.kill(before["worker"], signal.SIGKILL)
    os.kill(before["api"], signal.SIGKILL)

    def both_back() -> bool:
        assert stack.process is not None and stack.process.poll() is None, stack.output()
        return all(f"dev: {name} is ready again" in stack.output() for name in ("worker", "api"))

    wait_for(both_back, 60, stack.output)
    for name in ("worker", "api"):
        assert f"dev: {name} exited with code -9; restarting in 1s" in stack.output()
    after = stack.children()
    assert after["worker"] != before["worker"] and after["api"] != before["api"]
    assert (after["temporal"], after["fake"]) == (before["temporal"], before["fake"])
    with httpx.Client(timeout=10) as http:
        enqueued = http.post(
            f"{stack.api}/v1/outboxes/demo/items",
            headers={"Idempotency-Key": "dev-2"},
            json={"destination": "fake-webhook", "payload": {"after": "restart"}},
        )
        assert enqueued.status_code == 202, enqueued.text
        wait_for(
            lambda: (
                http.get(f"{stack.api}/v1/outboxes/demo/items/dev-2").json()["status"] == "sent"
            ),
            60,
            stack.output,
        )

    assert stack.process is not None
    stack.process.send_signal(signal.SIGTERM)
    assert stack.wait() == 0, stack.output()
    assert all(gone(pid) for pid in [*before.values(), *after.values()]), stack.output()
    assert not any(port_in_use(port) for port in stack.ports.values())


def test_restart_delay_doubles_to_its_cap_and_resets_after_a_long_run() -> None:
    backoff = RestartBackoff(initial_s=1, max_s=30, reset_after_s=60)

    crash_loop = [backoff.delay_after(uptime_s=0.5) for _ in range(7)]
    after_a_long_run = backoff.delay_after(uptime_s=60)

    assert crash_loop == [1, 2, 4, 8, 16, 30, 30]
    assert after_a_long_run == 1 and backoff.delay_after(uptime_s=1) == 2


def test_supervise_restarts_a_dead_child_after_its_delay_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sleeper = Child(
        "sleeper",
        [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
        lambda: True,
        ready_line="up",
        backoff=RestartBackoff(initial_s=0.5),
    )
    env = dict(os.environ)
    supervising = [sleeper]
    try:
        start(supervising, env, log_dir=tmp_path)
        assert sleeper.process is not None
        first = sleeper.process
        first.kill()
        first.wait()

        supervise(supervising, env, colour=False)
        supervise(supervising, env, colour=False)
        assert sleeper.process is first  # still inside its delay
        time.sleep(0.6)
        supervise(supervising, env, colour=False)
        second = sleeper.process
        wait_for(sleeper.is_ready, 10, lambda: (tmp_path / "sleeper.log").read_text())
        supervise(supervising, env, colour=False)
    finally:
        stop(supervising)

    assert second is not first and second.returncode is not None
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "dev: sleeper exited with code -9; restarting in 0.5s",
        f"dev: sleeper restarted (pid {second.pid})",
        "dev: sleeper is ready again",
    ]


def fake_flags(env: dict[str, str]) -> argparse.Namespace:
    """The flags `make dev` starts the fake provider with, as the fake itself parses them."""
    (fake,) = [child for child in build_children(env) if child.name == "fake"]
    module = fake.command.index("devstack.fake_provider")
    return command_line_parser().parse_args(fake.command[module + 1 :])


def test_the_fake_reports_to_the_api_with_the_secret_every_child_gets(tmp_path: Path) -> None:
    env = {"DEV_DATA_DIR": str(tmp_path), "DEV_API_PORT": "8123"}
    chosen = {**env, "FAKE_EMAIL_EVENTS_SECRET": "s3cret/&=x"}

    default_flags, chosen_flags = fake_flags(env), fake_flags(chosen)

    events = "http://127.0.0.1:8123/v1/destinations/fake-email/events"
    # The secret travels in the environment (the fake's and the API's), never on a command line.
    assert default_flags.report_url == chosen_flags.report_url == events
    assert env["FAKE_EMAIL_EVENTS_SECRET"] == "dev-events-secret"
    assert chosen["FAKE_EMAIL_EVENTS_SECRET"] == "s3cret/&=x"
    for child in build_children(dict(chosen)):
        assert not any("s3cret" in argument for argument in child.command), child.name


def test_the_web_ui_on_another_port_may_call_the_codec_server(tmp_path: Path) -> None:
    env = {"DEV_DATA_DIR": str(tmp_path), "DEV_UI_PORT": "9233"}
    build_children(env)
    # Issue 32: with DEV_UI_PORT set, the allowed origins followed it (they were fixed to 8233).
    assert env["CODEC_CORS_ORIGINS"] == "http://127.0.0.1:9233,http://localhost:9233"
    chosen = {"DEV_DATA_DIR": str(tmp_path), "CODEC_CORS_ORIGINS": "https://ui.example"}
    build_children(chosen)
    assert chosen["CODEC_CORS_ORIGINS"] == "https://ui.example"  # one the user set wins


def test_fake_flags_from_dev_fake_args_win_over_the_stacks(tmp_path: Path) -> None:
    env = {
        "DEV_DATA_DIR": str(tmp_path),
        "DEV_FAKE_ARGS": "--bounce-rate 0.5 --report-url http://elsewhere/events",
    }

    flags = fake_flags(env)

    assert flags.bounce_rate == 0.5
    assert flags.report_url == "http://elsewhere/events"


def test_dev_fake_reports_0_sends_no_reports(tmp_path: Path) -> None:
    # The benchmarks set it: their destinations take no reports, and the traffic would skew them.
    flags = fake_flags({"DEV_DATA_DIR": str(tmp_path), "DEV_FAKE_REPORTS": "0"})

    assert flags.report_url is None
