"""The one flow guard around each submit and poll (`flowcontrol/guard.py`): which outcomes its
rules see, a request held by a full cap, the attempt log written around the request, and the
rules a process without the read model's database gets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.contract.item import (
    DeliveryErrorDetails,
    ItemErrorType,
    PollRequest,
    SubmitRequest,
)
from durable_outbox_temporal.destinations import Destination
from sqlalchemy import Engine, event
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from flowcontrol.adaptive import AdaptiveMeter
from flowcontrol.breaker import BreakerGate
from flowcontrol.caps import CapsGate, FlowLimits, NoCapsGate, RequestGate
from flowcontrol.guard import FlowGuard, NoAttemptLog
from flowcontrol.pacing import RequestPacer
from flowcontrol.throttle import ThrottleGate
from readmodel import attempts
from readmodel.db import create_schema, make_engine
from readmodel.flow_overrides import FlowPolicies

SUBMIT = SubmitRequest(
    destination="hook", item_id="tests/k", idempotency_key="idem", payload={}, attempt=1
)


class SeenBreaker(BreakerGate):
    """The breaker's side of the rule, recording the outcomes it is told of."""

    def __init__(self) -> None:
        super().__init__({})
        self.seen: list[str] = []

    def succeeded(self, destination: str) -> None:
        self.seen.append(f"{destination} ok")

    def failed(self, destination: str, error: str) -> None:  # type: ignore[override]
        self.seen.append(f"{destination} failed: {error}")  # and never reports it


class SeenThrottle(ThrottleGate):
    """The throttle's side of the rule, recording the throttles it is told of."""

    def __init__(self) -> None:
        super().__init__({})
        self.seen: list[tuple[int | None, float | None]] = []

    def throttled(  # type: ignore[override]
        self, destination: str, status: int | None, retry_after_s: float | None
    ) -> None:
        self.seen.append((status, retry_after_s))  # and never pauses the queue


def guard(
    breaker: BreakerGate | None = None,
    throttle: ThrottleGate | None = None,
    caps: RequestGate | None = None,
    engine: Engine | None = None,
) -> FlowGuard:
    return FlowGuard(
        RequestPacer({}),
        throttle or ThrottleGate({}),
        breaker or BreakerGate({}),
        caps or NoCapsGate({}),
        attempt_log=NoAttemptLog() if engine is None else attempts.AttemptLog(engine),
        adaptive=AdaptiveMeter({}),
        flow_task_queue="flows",
        events_task_queue="events",
    )


def failure(kind: str, status: int, retry_after_s: float | None = None) -> ApplicationError:
    """What the submit activity raises for a provider's failure."""
    details = DeliveryErrorDetails(retry_after_s=retry_after_s, status_code=status)
    return ApplicationError(f"HTTP {status}", details, type=kind, non_retryable=True)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    found = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    create_schema(found)
    yield found
    found.dispose()


async def test_a_submits_outcome_goes_to_the_breaker_and_the_throttle() -> None:
    breaker, throttle = SeenBreaker(), SeenThrottle()
    flow = guard(breaker, throttle)

    async def submit(raised: Exception | None) -> None:
        async with flow.submit(SUBMIT):
            if raised is not None:
                raise raised

    env = ActivityEnvironment()
    await env.run(submit, None)
    for raised in (
        failure(ItemErrorType.TRANSIENT, 500),
        failure(ItemErrorType.TRANSIENT, 429, retry_after_s=7),
        failure(ItemErrorType.PERMANENT, 400),
    ):
        with pytest.raises(ApplicationError) as err:
            await env.run(submit, raised)
        assert err.value is raised

    # Only transient failures count; a throttle (a 429, a 503 with Retry-After) is not a
    # failure of the destination's circuit, and an item's own fault is neither.
    assert breaker.seen == ["hook ok", "hook failed: HTTP 500"]
    assert throttle.seen == [(500, None), (429, 7.0)]


async def test_a_poll_counts_for_neither_rule() -> None:
    breaker, throttle = SeenBreaker(), SeenThrottle()
    flow = guard(breaker, throttle)

    async def poll() -> None:
        async with flow.poll(PollRequest(destination="hook", item_id="tests/k", operation_url="")):
            raise failure(ItemErrorType.TRANSIENT, 500)

    with pytest.raises(ApplicationError):
        await ActivityEnvironment().run(poll)
    assert breaker.seen == [] and throttle.seen == []


async def test_a_request_that_cannot_get_its_permit_in_time_is_held(engine: Engine) -> None:
    caps = CapsGate(
        engine,
        {"hook": FlowLimits("hook", max_in_flight=1, request=timedelta(seconds=1))},
        FlowPolicies(engine, {}),
    )
    flow = guard(caps=caps)

    async def submit() -> None:
        async with flow.submit(SUBMIT):
            pytest.fail("the request went out beyond its cap")

    async with caps.slot("hook", None, submit=False, deadline=datetime.now(UTC).timestamp()):
        with pytest.raises(ApplicationError) as held:
            await ActivityEnvironment().run(submit)

    assert held.value.type == ItemErrorType.HELD and held.value.non_retryable
    details = held.value.details[0]
    assert isinstance(details, DeliveryErrorDetails) and details.retry_after_s
    assert "concurrency cap of destination hook" in held.value.message


async def test_the_requests_exchanges_go_to_the_items_attempt_log(engine: Engine) -> None:
    flow = guard(engine=engine)

    async def submit() -> None:
        async with flow.submit(SUBMIT):
            # As the provider's `send` notes each HTTP exchange.
            attempts.note(
                "POST", "https://hook.test/in?token=x", {}, datetime.now(UTC), 5, status=202
            )

    await ActivityEnvironment().run(submit)
    assert isinstance(flow.attempt_log, attempts.AttemptLog)
    await flow.attempt_log.flush()

    logged = attempts.read_attempts(engine, SUBMIT.item_id)
    assert [(a["kind"], a["request"]["path"], a["response"]["status"]) for a in logged] == [
        ("submit", "/in", 202)
    ]


async def test_a_plain_destinations_request_leaves_the_read_model_alone(engine: Engine) -> None:
    """No caps, no quotas: once the process has read the run-time policies, a request makes no
    read-model round trip; its exchanges go to the attempt log after it, in one transaction."""
    clock = [0.0]
    policies = FlowPolicies(engine, {"hook": FlowPolicy()}, clock=lambda: clock[0])
    log = attempts.AttemptLog(engine)
    flow = FlowGuard(
        RequestPacer({}),
        ThrottleGate({}),
        BreakerGate({}),
        CapsGate(engine, {"hook": FlowLimits("hook")}, policies),
        attempt_log=log,
        adaptive=AdaptiveMeter({}),
        flow_task_queue="flows",
        events_task_queue="events",
    )
    statements: list[tuple[str, str]] = []

    def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append((threading.current_thread().name, statement))

    async def submit() -> None:
        async with flow.submit(SUBMIT):
            for status in (202, 200):  # a submit and its first poll's exchanges
                attempts.note(
                    "POST", "https://hook.test/in", {}, datetime.now(UTC), 5, status=status
                )

    await ActivityEnvironment().run(submit)  # the process's first read of its policies
    await log.flush()
    event.listen(engine, "before_cursor_execute", executed)
    try:
        await ActivityEnvironment().run(submit)
        on_the_path = [s for thread, s in statements if not thread.startswith("attempt-log")]
        await log.flush()
    finally:
        event.remove(engine, "before_cursor_execute", executed)

    assert on_the_path == []
    # On the attempt log's thread: the items' numbering held (SQLite's write lock), their last
    # numbers read, the rows written.
    assert [thread for thread, _ in statements] == ["attempt-log_0"] * 3
    assert statements[0][1] == "BEGIN IMMEDIATE"
    assert log.transactions == 2  # one per request's batch
    logged = attempts.read_attempts(engine, SUBMIT.item_id)
    assert [a["n"] for a in logged] == [1, 2, 3, 4]


def hook(**fields: Any) -> Destination:
    return Destination(
        name="hook",
        provider="webhook",
        settings={"url": "http://127.0.0.1:9/hook", "secret": "s"},
        **fields,
    )


def built(ledger: Engine | None, destination: Destination) -> FlowGuard:
    """The guard as a worker process builds it (the server's rates are never read here)."""
    return FlowGuard.for_destinations(
        [destination],
        None,  # type: ignore[arg-type]
        ledger=ledger,
        default_request_s=10.0,
        flow_task_queue="flows",
        events_task_queue="events",
    )


async def test_without_the_database_a_request_goes_straight_through_and_is_logged_nowhere() -> None:
    flow = built(None, hook())
    assert isinstance(flow.attempt_log, NoAttemptLog)

    async def submit() -> str:
        async with flow.submit(SUBMIT):
            attempts.note("POST", "https://hook.test/in", {}, datetime.now(UTC), 5, status=202)
        return "sent"

    assert await ActivityEnvironment().run(submit) == "sent"


def test_a_process_without_the_database_refuses_a_destination_with_caps(engine: Engine) -> None:
    capped = hook(flow={"max_in_flight": 2})
    with pytest.raises(ValueError, match="hook have caps or quotas.*DATABASE_URL"):
        built(None, capped)
    # With it, they count there, and the requests are logged there.
    assert isinstance(built(engine, capped).attempt_log, attempts.AttemptLog)
