"""Flow rules changed at run time (`readmodel/flow_overrides.py`) over a real read-model
database: stored and put back, read again by each worker's `FlowPolicies` once its copy is
stale, the last known kept while the database cannot be read, and applied by the gates."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from pydantic import ValidationError
from sqlalchemy import Engine, text

from flowcontrol.breaker import BreakerGate, BreakerQueue
from flowcontrol.caps import CapsGate, FlowLimits, Held
from readmodel.db import create_schema, make_engine
from readmodel.flow_overrides import FlowPolicies, read_overrides, write_overrides
from readmodel.permits import return_permits, take_permits, take_requests
from service.destinations import DestinationControls

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[Engine]]:
    # Two worker processes' engines onto one database, as two processes would have.
    found = [make_engine(f"sqlite:///{tmp_path / 'readmodel.db'}") for _ in range(2)]
    create_schema(found[0])
    yield found
    for engine in found:
        engine.dispose()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_override_is_stored_and_null_puts_the_files_back(engines: list[Engine]) -> None:
    engine = engines[0]
    write_overrides(engine, "hook", {"max_in_flight": 2, "quotas": [{"per": "1s", "max": 3}]}, NOW)
    write_overrides(engine, "other", {"breaker": False}, NOW)
    found = read_overrides(engine, "hook")
    assert {field: o.value for field, o in found["hook"].items()} == {
        "max_in_flight": 2,
        "quotas": [{"per": "1s", "max": 3}],
    }
    assert found["hook"]["max_in_flight"].changed_at == NOW
    write_overrides(engine, "hook", {"max_in_flight": None}, NOW + timedelta(seconds=1))
    assert set(read_overrides(engine)["hook"]) == {"quotas"}
    assert read_overrides(engine)["other"]["breaker"].value is False


async def test_a_worker_reads_overrides_again_once_its_copy_is_stale(
    engines: list[Engine],
) -> None:
    clock = Clock()
    policies = FlowPolicies(engines[1], {"hook": FlowPolicy(max_in_flight=5)}, clock=clock)
    assert (await policies.fresh("hook")).max_in_flight == 5  # type: ignore[union-attr]
    write_overrides(engines[0], "hook", {"max_in_flight": 1, "breaker": False}, NOW)
    # Within the refresh interval the copy stands: no read per request.
    clock.now = 1.9
    assert (await policies.fresh("hook")).max_in_flight == 5  # type: ignore[union-attr]
    clock.now = 2.0
    policy = await policies.fresh("hook")
    assert policy is not None and policy.max_in_flight == 1 and policy.breaker is False
    # Back to the file's.
    write_overrides(engines[0], "hook", {"max_in_flight": None}, NOW)
    clock.now = 4.0
    assert (await policies.fresh("hook")).max_in_flight == 5  # type: ignore[union-attr]
    assert policies.current("unknown") is None


async def test_a_copy_half_the_interval_old_is_read_again_without_waiting(
    engines: list[Engine],
) -> None:
    clock = Clock()
    policies = FlowPolicies(engines[1], {"hook": FlowPolicy(max_in_flight=5)}, clock=clock)
    await policies.fresh("hook")
    write_overrides(engines[0], "hook", {"max_in_flight": 1}, NOW)
    clock.now = 1.0
    # The request is answered from the copy at once ...
    assert (await policies.fresh("hook")).max_in_flight == 5  # type: ignore[union-attr]
    # ... while the read it started brings the change in for the next one.
    for _ in range(200):
        if policies.current("hook").max_in_flight == 1:  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    assert policies.current("hook").max_in_flight == 1  # type: ignore[union-attr]


async def test_a_stale_copy_is_read_again_in_the_background_for_sync_callers(
    engines: list[Engine],
) -> None:
    clock = Clock()
    policies = FlowPolicies(engines[1], {"hook": FlowPolicy()}, clock=clock)
    write_overrides(engines[0], "hook", {"breaker_min_failures": 3}, NOW)
    # The first call answers the file's at once and starts a read.
    assert policies.current("hook").breaker_min_failures == 10  # type: ignore[union-attr]
    for _ in range(200):
        if policies.current("hook").breaker_min_failures == 3:  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    assert policies.current("hook").breaker_min_failures == 3  # type: ignore[union-attr]


async def test_a_database_error_keeps_the_last_known_policy(
    engines: list[Engine], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    policies = FlowPolicies(engines[1], {"hook": FlowPolicy()}, clock=clock)
    write_overrides(engines[0], "hook", {"max_in_flight": 2}, NOW)
    assert (await policies.fresh("hook")).max_in_flight == 2  # type: ignore[union-attr]
    with engines[0].begin() as connection:
        connection.execute(text("ALTER TABLE flow_overrides RENAME TO flow_overrides_gone"))
    clock.now = 10.0
    with caplog.at_level(logging.WARNING, logger="outbox.flow"):
        assert (await policies.fresh("hook")).max_in_flight == 2  # type: ignore[union-attr]
    assert "last known stay in force" in caplog.text


async def test_a_cap_set_at_run_time_holds_across_gates(engines: list[Engine]) -> None:
    configured = {"hook": FlowPolicy()}
    limits = {"hook": FlowLimits("hook", request=timedelta(seconds=1))}
    gates = [
        CapsGate(engine, limits, policies=FlowPolicies(engine, configured, refresh_s=0))
        for engine in engines
    ]
    # No cap configured: both gates let two requests out at once.
    async with (
        gates[0].slot("hook", "a", submit=True, deadline=time.time()),
        gates[1].slot("hook", "a", submit=True, deadline=time.time()),
    ):
        pass
    write_overrides(engines[0], "hook", {"key_max_in_flight": 1}, NOW)
    async with gates[0].slot("hook", "a", submit=True, deadline=time.time() + 30):
        with pytest.raises(Held, match=r"concurrency cap of key 'a' \(1 out at once\)"):
            async with gates[1].slot("hook", "a", submit=True, deadline=time.time() + 0.2):
                pass
        # Another key has its own share.
        async with gates[1].slot("hook", "b", submit=True, deadline=time.time()):
            pass


def test_the_breaker_follows_its_run_time_settings(engines: list[Engine]) -> None:
    current: dict[str, FlowPolicy] = {"hook": FlowPolicy(breaker_min_failures=2)}
    queue = BreakerQueue(
        destination="hook",
        task_queue="hook-submit",
        poll_task_queue="hook-poll",
        configured_rate=1.0,
        enabled=True,
        window_s=30,
        min_failures=2,
        failure_ratio=0.5,
        probe_interval_s=15,
        close_after=1,
    )
    gate = BreakerGate({"hook": queue}, clock=lambda: 100.0, policies=current.get)
    current["hook"] = FlowPolicy(breaker=False)
    assert gate.failed("hook", "boom") is None
    assert gate.failed("hook", "boom") is None
    # On again, with its own threshold: the failures while it was off do not count.
    current["hook"] = FlowPolicy(breaker_min_failures=3, breaker_probe_interval_s=2)
    assert gate.failed("hook", "boom") is None
    assert gate.failed("hook", "boom") is None
    seen = gate.failed("hook", "boom")
    assert seen is not None and seen.failures == 3 and seen.probe_interval_s == 2


async def test_a_destination_says_which_caps_and_quotas_hold_its_items_now(
    engines: list[Engine],
) -> None:
    engine = engines[0]
    destination = Destination.model_validate(
        {"name": "hook", "provider": "webhook", "flow": {"max_in_flight": 5}}
    )
    controls = DestinationControls(None, DestinationRegistry({"hook": destination}), engine)  # type: ignore[arg-type]
    assert await controls.holding("hook") == []
    # Set at run time: one permit a key, two submits a minute for the destination.
    write_overrides(
        engine, "hook", {"key_max_in_flight": 1, "quotas": [{"per": "60s", "max": 2}]}, NOW
    )
    now = datetime.now(UTC)
    lease = timedelta(minutes=1)
    assert take_permits(engine, [("inflight/hook/tenant-a", 1)], "h1", now, lease) is None
    assert take_permits(engine, [("inflight/hook/tenant-b", 1)], "h2", now, lease) is None
    assert take_requests(engine, [("quota/hook", ((timedelta(seconds=60), 2),))], now)[1]
    assert await controls.holding("hook") == [
        "the concurrency cap of key 'tenant-a' (1 out at once)",
        "the concurrency cap of key 'tenant-b' (1 out at once)",
    ]
    assert take_requests(engine, [("quota/hook", ((timedelta(seconds=60), 2),))], now)[1]
    return_permits(engine, ["inflight/hook/tenant-b"], "h2")
    assert await controls.holding("hook") == [
        "the concurrency cap of key 'tenant-a' (1 out at once)",
        "the quota of destination hook (2 per 60 s)",
    ]


async def test_a_flow_change_the_destinations_mode_cannot_honour_is_refused(
    engines: list[Engine],
) -> None:
    engine = engines[0]
    # Its lanes send four items per submit activity: only its quota holds them to the rate.
    destination = Destination.model_validate(
        {
            "name": "hook",
            "provider": "webhook",
            "submit_rate": 5,
            "lane_run": 4,
            "flow": {"quotas": [{"per": "1s", "max": 5}]},
        }
    )
    controls = DestinationControls(None, DestinationRegistry({"hook": destination}), engine)  # type: ignore[arg-type]
    for quotas in ([], [{"per": "1s", "max": 50}]):
        with pytest.raises(ValidationError, match="lane_run 4 needs a quota"):
            await controls.update("hook", flow={"quotas": quotas})
    # A lower submit rate would leave the quota above it: refused too, before any rate is set.
    with pytest.raises(ValidationError, match="lane_run 4 needs a quota"):
        await controls.update("hook", submit_rate=2)
    assert read_overrides(engine) == {}
