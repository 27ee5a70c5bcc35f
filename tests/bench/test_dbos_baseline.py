"""The DBOS baseline survives what the product and the naive baseline survive: a provider that
drops a connection after taking the request. Its steps are retried, each retry repeating the same
request (the provider dedupes it), so every item is sent once. Before, one dropped connection
failed a workflow and ended a full run's end to end scenario (2026-11-29)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.dbos_baseline import CONFIGURATIONS as ALL_CONFIGURATIONS
from bench.dbos_baseline import DbosBaselines
from devstack.fake_provider import FaultConfig, run_fake_provider

ITEMS = 10
# Both ways the baseline's workflows run (its steps are written twice); the system database's
# place does not change them.
CONFIGURATIONS = tuple(c for c in ALL_CONFIGURATIONS if c.database == "sqlite")


# Two DBOS processes launch (tens of seconds each on a loaded machine: 42 s for both, one after
# the other, on 2026-11-30) and a dropped connection's retries back off from 1 s, doubling, as
# Temporal's default policy does: a full run's load once took this test past the suite's 180 s.
@pytest.mark.timeout(360)
async def test_both_kinds_of_workflow_send_each_item_once_through_dropped_connections(
    tmp_path: Path,
) -> None:
    async with run_fake_provider(FaultConfig(lost_response_rate=0.3)) as fake:
        env = {**os.environ, "FAKE_PROVIDER_URL": fake.url}
        with DbosBaselines(tmp_path, env, CONFIGURATIONS) as baselines:
            for configuration in CONFIGURATIONS:
                assert await baselines.run(configuration.name, ITEMS) == ITEMS, configuration
        totals = (await fake.admin.stats())["totals"]

    assert {c.asynchronous for c in CONFIGURATIONS} == {True, False}
    assert totals["deliveries"] == ITEMS * len(CONFIGURATIONS), totals
    assert totals["duplicates"] == 0, totals
    # Some submits were taken and their answers dropped, then repeated: more than one an item.
    assert totals["submits"] > ITEMS * len(CONFIGURATIONS), totals
