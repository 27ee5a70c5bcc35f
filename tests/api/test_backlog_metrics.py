"""Backlog metrics at `/metrics`: what real items through the stack do to them, and how the
collector behaves when the read model is slow, down, or scraped often."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.lane import LaneStatus
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine
from sqlalchemy import event as sa_event

from api.backlog_metrics import FAMILIES, BacklogMetrics
from readmodel.db import make_engine
from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.api.test_lanes import enqueue as enqueue_in_lane
from tests.api.test_lanes import fail_first_submit
from tests.fakes import script
from tests.readmodel.test_backlog import put, put_lane
from tests.workflows.test_lane import item_result, wait_for
from tests.workflows.test_outbox_item import wait_for_status

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape by name and labels, read with Prometheus' own parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class Scrape:
    """One scrape of `/metrics`, with the wall-clock interval it was taken in."""

    def __init__(self, samples: Samples, before: datetime, after: datetime) -> None:
        self.samples = samples
        self.before = before
        self.after = after

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def __getitem__(self, key: tuple[str, dict[str, str]]) -> float:
        name, labels = key
        value = self.get(name, **labels)
        assert value is not None, f"{name}{labels} not exported"
        return value


async def scrape(http: httpx.AsyncClient) -> Scrape:
    before = datetime.now(UTC)
    response = await http.get("/metrics")
    after = datetime.now(UTC)
    assert response.status_code == 200, response.text
    return Scrape(parse(response.text), before, after)


async def scrape_until(http: httpx.AsyncClient, condition: Callable[[Scrape], bool]) -> Scrape:
    """Scrape until `condition` holds: projections reach the read model a moment after."""
    found: list[Scrape] = []

    async def holds() -> bool:
        found[:] = [await scrape(http)]
        return condition(found[0])

    await wait_for(holds)
    return found[0]


def assert_age_of(result: Scrape, labels: dict[str, str], created_at: datetime) -> None:
    """The exported age is that of the item created at `created_at`, as of the scrape."""
    age = result[("outbox_oldest_queued_age_seconds", labels)]
    low = (result.before - created_at).total_seconds()
    high = (result.after - created_at).total_seconds()
    assert low - 0.001 <= age <= high + 0.001, (low, age, high)


async def post_item(api: Api, key: str, **fields: Any) -> datetime:
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"key": key}, **fields},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 202, response.text
    item = (await api.http.get(f"/v1/outboxes/tests/items/{key}")).json()
    return datetime.fromisoformat(item["created_at"])


KEY_NAMES = ("early", "later", "refused", "fine")


async def test_backlog_metrics_follow_real_items_through_the_stack(api_factory) -> None:
    api: Api = await api_factory(backlog_metrics_cache_s=0)
    # Keys of their own: the time-skipping server and its workflow ids outlive each test.
    early, later, refused, fine = (f"{name}-{uuid.uuid4().hex[:6]}" for name in KEY_NAMES)
    per_destination = {"outbox": "tests", "destination": api.webhook.name}

    def value(result: Scrape, name: str, **labels: str) -> float:
        return result[(name, {**per_destination, **labels})]

    def sent(result: Scrape) -> float | None:
        return result.get("outbox_items_sent_total", **per_destination)

    # `early` and `later` are refused once and wait queued an hour for their retry.
    for key in (early, later):
        refused_once = [{"status": 503, "retry_after": "3600"}]
        await script(api.stack.fake, item_workflow_id("tests", key), refused_once)
    await script(api.stack.fake, item_workflow_id("tests", refused), [{"status": 400}])
    early_at = await post_item(api, early)
    await wait_for_status(api.stack, early, attempts=1)
    # Far enough apart in age for a scrape (tens of ms) to tell them apart below.
    await asyncio.sleep(0.3)
    later_at = await post_item(api, later)
    await wait_for_status(api.stack, later, attempts=1)
    await post_item(api, refused)
    await post_item(api, fine)

    gap = later_at - early_at
    # A scrape shorter than the gap between the two items tells their ages apart; a loaded
    # machine may take longer over one, so the next scrape is taken.
    first = await scrape_until(
        api.http,
        lambda s: (
            sent(s) == 1
            and s.get("outbox_items", **per_destination, status="failed") == 1
            and s.after - s.before < gap
        ),
    )
    assert first[("outbox_backlog_scrape_ok", {})] == 1
    assert value(first, "outbox_items", status="queued") == 2
    assert value(first, "outbox_items", status="sending") == 0
    assert value(first, "outbox_items_failed_total") == 1
    assert_age_of(first, per_destination, early_at)

    # The dead letter is redriven and delivered: no dead letter left, the failure still counted.
    redriven = await api.http.post(f"/v1/outboxes/tests/items/{refused}/redrive")
    assert redriven.status_code == 202, redriven.text
    second = await scrape_until(api.http, lambda s: sent(s) == 2)
    assert value(second, "outbox_items", status="failed") == 0
    assert value(second, "outbox_items_failed_total") == 1
    assert value(second, "outbox_items", status="queued") == 2

    # The oldest leaves the queue: `later` is the oldest now.
    cancelled = await api.http.post(f"/v1/outboxes/tests/items/{early}/cancel", json={})
    assert cancelled.status_code == 200, cancelled.text
    third = await scrape_until(
        api.http, lambda s: s.get("outbox_items", **per_destination, status="queued") == 1
    )
    assert_age_of(third, per_destination, later_at)

    # `later`'s hour passes (time skips): it is delivered, and nothing is queued any more.
    assert (await api.stack.result(item_workflow_id("tests", later))).status is ItemStatus.SENT
    fourth = await scrape_until(api.http, lambda s: sent(s) == 3)
    assert value(fourth, "outbox_items", status="queued") == 0
    assert value(fourth, "outbox_oldest_queued_age_seconds") == 0
    assert value(fourth, "outbox_items_failed_total") == 1


async def test_a_halted_lane_shows_until_it_is_skipped(api_factory) -> None:
    api: Api = await api_factory(backlog_metrics_cache_s=0)
    await fail_first_submit(api, "m-0")
    for n in range(3):
        response = await enqueue_in_lane(api, f"m-{n}", n, lane="acct-m")
        assert response.status_code == 202, response.text

    def lanes(result: Scrape, name: str, status: str | None = None) -> float | None:
        return result.get(name, outbox="tests", **({"status": status} if status else {}))

    # A lane's row trails its appends by up to a second (`workflows/ordering.py`).
    halted = await scrape_until(
        api.http,
        lambda s: (
            lanes(s, "outbox_lanes", "halted") == 1 and lanes(s, "outbox_lane_items", "halted") == 3
        ),
    )
    per_destination = {"outbox": "tests", "destination": api.webhook.name}
    assert lanes(halted, "outbox_lanes", "running") == 0
    # The failed head and the two waiting behind it.
    assert lanes(halted, "outbox_lane_items", "halted") == 3
    assert lanes(halted, "outbox_longest_lane_items") == 3
    assert halted[("outbox_items", {**per_destination, "status": "failed"})] == 1
    assert halted[("outbox_items", {**per_destination, "status": "queued"})] == 2

    skipped = await api.http.post("/v1/outboxes/tests/lanes/acct-m/skip", json={"reason": "bad"})
    assert skipped.status_code == 202, skipped.text
    await item_result(api.stack, "m-2")
    drained = await scrape_until(
        api.http,
        lambda s: (
            lanes(s, "outbox_lanes", "halted") == 0
            and lanes(s, "outbox_lane_items", "running") == 0
        ),
    )
    assert lanes(drained, "outbox_lane_items", "halted") == 0
    assert lanes(drained, "outbox_longest_lane_items") == 0
    assert drained[("outbox_items_sent_total", per_destination)] == 2
    assert drained[("outbox_items", {**per_destination, "status": "failed"})] == 1


async def test_an_unreachable_read_model_reports_scrape_ok_0_and_the_rest(api_factory) -> None:
    unreachable = make_engine("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    api: Api = await api_factory(engine=unreachable, backlog_metrics_cache_s=0)
    await api.http.get("/v1/outboxes/tests/items/none")

    result = await scrape(api.http)

    assert result[("outbox_backlog_scrape_ok", {})] == 0
    assert not any(name == "outbox_items" for name, _ in result.samples)
    route = {"method": "GET", "route": "/v1/outboxes/{outbox}/items/{key}", "status": "503"}
    assert result[("outbox_http_requests_total", route)] == 1


QUEUED_O_D = (
    "outbox_items",
    frozenset({"outbox": "o", "destination": "d", "status": "queued"}.items()),
)
SCRAPE_OK = ("outbox_backlog_scrape_ok", frozenset[tuple[str, str]]())


def collector(engine: Engine, **settings: float) -> tuple[BacklogMetrics, CollectorRegistry]:
    """The collector on its own registry over `engine` (no cache, a generous timeout)."""
    registry = CollectorRegistry()
    metrics = BacklogMetrics(registry, **{"cache_s": 0.0, "timeout_s": 5.0, **settings})
    metrics.attach(engine)
    return metrics, registry


async def refreshed(metrics: BacklogMetrics, registry: CollectorRegistry) -> Samples:
    """What a scrape of the registry shows, the way the `/metrics` route takes it."""
    await metrics.refresh()
    return parse(generate_latest(registry).decode())


def record_readings(engine: Engine) -> list[str]:
    """Records the first statement of each reading of the backlog run on `engine`."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "FROM outbox_items" in statement and "GROUP BY outbox_items.status" in statement:
            statements.append(statement)

    sa_event.listen(engine, "before_cursor_execute", record)
    return statements


async def test_scrapes_within_the_cache_time_share_one_reading(engine: Engine) -> None:
    metrics, registry = collector(engine, cache_s=60)
    readings = record_readings(engine)
    put(engine, "q", ItemStatus.QUEUED)

    # Concurrent scrapes wait for one reading between them.
    await asyncio.gather(*(metrics.refresh() for _ in range(3)))
    first = parse(generate_latest(registry).decode())
    put(engine, "q2", ItemStatus.QUEUED)
    cached = await refreshed(metrics, registry)
    metrics.cache_s = 0
    fresh = await refreshed(metrics, registry)

    assert len(readings) == 2
    assert (first[QUEUED_O_D], cached[QUEUED_O_D], fresh[QUEUED_O_D]) == (1, 1, 2)
    await metrics.detach()


async def test_a_slow_reading_reports_scrape_ok_0_then_serves_later_scrapes(
    engine: Engine,
) -> None:
    metrics, registry = collector(engine, cache_s=60, timeout_s=0.2)
    readings = record_readings(engine)
    put(engine, "q", ItemStatus.QUEUED)

    def slow_down(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if readings == [statement]:  # the first reading's first statement, once
            time.sleep(0.6)  # in the reading's thread: the event loop goes on meanwhile

    sa_event.listen(engine, "before_cursor_execute", slow_down)
    started = time.perf_counter()
    late = await refreshed(metrics, registry)
    waited = time.perf_counter() - started
    served: list[Samples] = []

    async def reading_arrived() -> bool:
        served[:] = [await refreshed(metrics, registry)]
        return served[0][SCRAPE_OK] == 1

    await wait_for(reading_arrived)

    assert waited < 0.5
    assert late[SCRAPE_OK] == 0 and not any(name == "outbox_items" for name, _ in late)
    # The late reading itself served the scrapes after it: no second reading was started.
    assert served[0][QUEUED_O_D] == 1 and len(readings) == 1
    assert served[0][("outbox_backlog_scrape_duration_seconds", frozenset())] >= 0.6
    await metrics.detach()


async def test_a_reading_exports_every_family_the_alert_rules_may_name(engine: Engine) -> None:
    metrics, registry = collector(engine)
    put(engine, "q", ItemStatus.QUEUED)
    put(engine, "s", ItemStatus.SENT)
    put_lane(engine, "a", LaneStatus.HALTED, 2)

    exported = {name for name, _ in await refreshed(metrics, registry)}

    assert {family.sample_name for family in FAMILIES} <= exported
    await metrics.detach()


async def test_refused_enqueues_of_invented_outboxes_share_one_label(api: Api) -> None:
    """Issue 31: each outbox name a caller invented added series to the open `/metrics`."""
    invented = [f"made-up-{n}" for n in range(30)]
    for outbox in [*invented, "tests"]:
        refused = await api.http.post(
            f"/v1/outboxes/{outbox}/items", json={"destination": "nowhere", "payload": {}}
        )
        assert refused.status_code == 404, refused.text
    accepted = await api.http.post(
        "/v1/outboxes/real/items", json={"destination": api.webhook.name, "payload": {}}
    )
    assert accepted.status_code == 202, accepted.text
    await api.http.post("/v1/outboxes/real/items", json={"destination": "nowhere", "payload": {}})

    text = (await api.http.get("/metrics")).text
    samples = parse(text)

    enqueued = "outbox_items_enqueued_total"
    assert "made-up" not in text
    unknown = {"outbox": "(unknown)", "destination": "unknown", "result": "rejected"}
    # "tests" has no items either: only an outbox that exists keeps its name.
    assert samples[(enqueued, frozenset(unknown.items()))] == len(invented) + 1
    real = {"outbox": "real", "destination": "unknown", "result": "rejected"}
    assert samples[(enqueued, frozenset(real.items()))] == 1


async def test_metrics_need_a_metrics_token_when_tokens_are_configured(
    api_factory, tmp_path
) -> None:
    """With tokens configured, a scrape needs a token with the `metrics` scope: the series name
    outboxes and destinations."""
    tokens = tmp_path / "tokens.toml"
    lines = []
    for name, scopes in (("prometheus", '["metrics"]'), ("reader", '["read"]')):
        digest = hashlib.sha256(f"{name}-token".encode()).hexdigest()
        lines += [f"[tokens.{name}]", f'sha256 = "{digest}"', f"scopes = {scopes}"]
    tokens.write_text("\n".join(lines) + "\n")
    api = await api_factory(api_token="operator-token", api_tokens_file=str(tokens))

    refused = await api.http.get("/metrics")
    assert_problem(refused, 401, "unauthorized")
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert_problem(await api.http.get("/metrics", headers={"Authorization": "Bearer wrong"}), 403)
    reader = await api.http.get("/metrics", headers={"Authorization": "Bearer reader-token"})
    assert assert_problem(reader, 403, "forbidden")["missing_scope"] == "metrics"
    for token in ("prometheus-token", "operator-token"):
        scraped = await api.http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert scraped.status_code == 200 and "outbox_items_enqueued_total" in scraped.text
    # Nothing else is open to the metrics token.
    stats = await api.http.get(
        "/v1/outboxes/tests/stats", headers={"Authorization": "Bearer prometheus-token"}
    )
    assert_problem(stats, 403, "forbidden")
    # The stack runs without payload keys (listed); nothing of the metrics is.
    insecure = (await api.http.get("/readyz")).json().get("insecure", [])
    assert not [reason for reason in insecure if "metrics" in reason.lower()]


async def test_an_open_metrics_route_is_a_choice_listed_as_insecure(api_factory) -> None:
    """`METRICS_TOKEN_REQUIRED=false`: Prometheus scrapes without a token, a token sent is
    checked all the same, and `/readyz` says the metrics are open."""
    api = await api_factory(api_token="operator-token", metrics_token_required=False)

    assert (await api.http.get("/metrics")).status_code == 200
    assert_problem(await api.http.get("/metrics", headers={"Authorization": "Bearer wrong"}), 403)
    ready = (await api.http.get("/readyz")).json()
    assert "METRICS_TOKEN_REQUIRED=false: /metrics answers without a token" in ready["insecure"]


async def test_a_bulk_destination_exports_its_shard_count_and_an_item_mode_one_none(
    api_factory, dev_env
) -> None:
    # What `OutboxBulkShardsHoldTooMuch` divides a destination's backlog by (the destinations'
    # state is read from the task queues: the dev server).
    api: Api = await api_factory(email_overrides={"mode": "bulk", "shards": 3}, env=dev_env)

    found = await scrape_until(api.http, lambda s: s.get("outbox_destinations_scrape_ok") == 1.0)

    assert found["outbox_destination_shards", {"destination": api.email.name}] == 3
    assert found.get("outbox_destination_shards", destination=api.webhook.name) is None
