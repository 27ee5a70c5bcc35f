"""The activities' gate for caps and quotas (`flowcontrol/caps.py` `CapsGate`) over a real
read-model database: gates of several processes (here: several engines onto one file) never let
more requests out at once than a cap, a request that cannot wait is held, a quota's window
holds."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from flowcontrol.caps import CapsGate, FlowLimits, Held, NoCapsGate
from readmodel.db import create_schema, make_engine
from readmodel.flow_overrides import FlowPolicies


@pytest.fixture
def engines(tmp_path: Path) -> list[Engine]:
    found = [make_engine(f"sqlite:///{tmp_path / 'ledger.db'}") for _ in range(3)]
    create_schema(found[0])
    yield found  # type: ignore[misc]
    for engine in found:
        engine.dispose()


def limits(**fields: object) -> dict[str, FlowLimits]:
    return {"hook": FlowLimits("hook", request=timedelta(seconds=1), **fields)}  # type: ignore[arg-type]


def gate(engine: Engine, found: dict[str, FlowLimits]) -> CapsGate:
    """A process's gate, its destinations' caps and quotas as configured (none changed)."""
    return CapsGate(engine, found, FlowPolicies(engine, {}))


async def test_requests_of_one_key_never_overlap_beyond_its_cap(engines: list[Engine]) -> None:
    gates = [gate(engine, limits(key_max_in_flight=2, max_in_flight=3)) for engine in engines]
    out: dict[str, int] = {}
    most: dict[str, int] = {}

    async def request(n: int, key: str) -> None:
        gate = gates[n % len(gates)]
        async with gate.slot("hook", key, submit=True, deadline=time.time() + 30):
            out[key] = out.get(key, 0) + 1
            most[key] = max(most.get(key, 0), out[key])
            most["all"] = max(most.get("all", 0), sum(out.values()))
            await asyncio.sleep(0.05)
            out[key] -= 1

    await asyncio.gather(*(request(n, "a" if n % 3 else "b") for n in range(18)))
    assert most["a"] <= 2 and most["b"] <= 2 and most["all"] <= 3, most
    # Not held one at a time: requests did go side by side, up to the caps.
    assert max(most["a"], most["b"]) == 2 and most["all"] >= 2, most


async def test_a_request_that_cannot_wait_is_held(engines: list[Engine]) -> None:
    capped = gate(engines[0], limits(max_in_flight=1))
    async with capped.slot("hook", None, submit=False, deadline=time.time() + 30):
        with pytest.raises(Held, match=r"cap of destination hook \(1 out") as held:
            async with capped.slot("hook", None, submit=False, deadline=time.time() + 0.2):
                pass
    assert held.value.retry_after_s > 0
    # Returned: the next one goes at once.
    async with capped.slot("hook", None, submit=False, deadline=time.time()):
        pass


async def test_a_full_quota_says_when_it_has_room(engines: list[Engine]) -> None:
    quota = gate(engines[1], limits(quotas=((timedelta(seconds=60), 2),)))
    for _ in range(2):
        async with quota.slot("hook", None, submit=True, deadline=time.time()):
            pass
    # Polls do not count in a submit quota.
    async with quota.slot("hook", None, submit=False, deadline=time.time()):
        pass
    with pytest.raises(Held, match=r"quota of destination hook \(2 per 60 s\)") as held:
        async with quota.slot("hook", None, submit=True, deadline=time.time() + 1):
            pass
    assert 55 < held.value.retry_after_s <= 60


async def test_a_worker_without_the_database_refuses_caps() -> None:
    with pytest.raises(ValueError, match="hook have caps or quotas.*DATABASE_URL"):
        NoCapsGate(limits(max_in_flight=1))
    with pytest.raises(ValueError, match="DATABASE_URL"):
        NoCapsGate(limits(key_quotas=((timedelta(seconds=1), 5),)))
    # No caps: no database needed, and every request goes straight through.
    uncounted = NoCapsGate(limits())
    assert not uncounted.applies("hook")
    async with uncounted.slot("hook", "k", submit=True, deadline=time.time()):
        pass
