"""`make chaos` (QUICK=1 for the short run): fault injection at scale, checked at the provider.

Starts its own stack (dev server on a WAL SQLite file, worker, API) on ports clear of `make dev`
and `make bench`; the fake provider runs in this process so its counters are read directly.
CHAOS_ITEMS items (1,000; 200 with QUICK=1) go through the API into a provider storm — 30% 5xx,
10% 429 with Retry-After (seconds and HTTP-date, alternating), 5% hung requests, operations
Running for several polls and some ending Failed — while the worker is SIGKILLed at three random
moments and restarted. Every item is then checked at the fake provider and in the read model.
Prints a table, writes `.bench/chaos.json`, and exits 1 on any loss, duplicate, unexpected
failure, rate above the server's limit or request before a Retry-After.

Environment: CHAOS_ITEMS (item count), CHAOS_SEED (the fake's fault draws and the kill moments;
printed with each run), CHAOS_DEADLINE_S (items not final this long after the enqueue are lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import Client

from bench.chaos_analysis import (
    BURST_S,
    ChaosRun,
    ItemEvidence,
    QueueTraffic,
    SubmitAnswer,
    Verdict,
    judge,
)
from bench.run import machine
from configuration.destinations import load_destinations
from configuration.settings import PROJECT_ROOT
from devstack.dev import Child, StartupError, build_children, start, stop
from devstack.fake_provider import (
    DEFAULT_ACS_ACCESS_KEY,
    DEFAULT_WEBHOOK_SECRET,
    FakeProviderAdmin,
    FakeProviderState,
    FaultConfig,
    create_app,
)
from devstack.outcomes import UNFINISHED, outcomes
from devstack.serving import serve_in_background

QUICK = os.environ.get("QUICK") == "1"
ITEMS = int(os.environ.get("CHAOS_ITEMS") or (200 if QUICK else 1000))
SEED = int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))
# Items still running this long after the enqueue count as lost.
DEADLINE_S = float(os.environ.get("CHAOS_DEADLINE_S") or (240 if QUICK else 480))
KILLS = 3
# `item` (a workflow per item) or `bulk` (the destinations' items held by shard workflows).
MODE = os.environ.get("CHAOS_MODE") or "item"
FINAL_STATUSES = ("sent", "failed", "cancelled")
OUTBOX = "chaos"
BATCH = 100  # the API's largest batch
WEBHOOK_EVERY = 4  # every 4th item is a webhook, the others are ACS emails
CHAOS_DIR = PROJECT_ROOT / ".bench" / "chaos"
LOG_DIR = CHAOS_DIR / "logs"
REPORT_PATH = PROJECT_ROOT / ".bench" / ("chaos.json" if MODE == "item" else f"chaos-{MODE}.json")
CONFIG = PROJECT_ROOT / "bench" / "chaos_destinations.toml"
PORTS = {
    "DEV_TEMPORAL_PORT": "7253",
    "DEV_UI_PORT": "8253",
    "DEV_API_PORT": "8020",
    "WORKER_METRICS_ADDRESS": "127.0.0.1:9484",
}
STORM = FaultConfig(
    error_rate=0.3,
    throttle_rate=0.1,
    retry_after="2",
    timeout_rate=0.05,
    hang_s=2.0,  # longer than the destinations' 1 s client timeout: the client gives up
    running_polls=3,
    operation_fail_rate=0.1,
    seed=SEED,
)
# The fake's 429s switch between delta-seconds and HTTP-date Retry-After this often.
RETRY_AFTER_FORM_PERIOD_S = 3.0


class SubmitAnswers:
    """Wraps the fake's app and keeps every answer to a submit (a POST), by idempotency key.

    The fake counts first-time deliveries; this also sees every accepted re-submit it deduped.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.by_key: dict[str, list[SubmitAnswer]] = defaultdict(list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        key = headers.get(b"operation-id") or headers.get(b"webhook-id")
        if scope["type"] != "http" or scope["method"] != "POST" or key is None:
            await self.app(scope, receive, send)
            return
        # Wall-clock times, like the Retry-After HTTP-dates and the worker kills they are held to.
        arrived = time.time()

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                retry_after = dict(message.get("headers", [])).get(b"retry-after")
                self.by_key[key.decode()].append(
                    SubmitAnswer(
                        arrived,
                        time.time(),
                        message["status"],
                        retry_after.decode() if retry_after else None,
                    )
                )
            await send(message)

        await self.app(scope, receive, recording_send)

    def all(self) -> Iterator[SubmitAnswer]:
        for answers in self.by_key.values():
            yield from answers


@dataclass
class Kill:
    """One SIGKILL of the worker: when, how far the run was, how long the restart took."""

    at: float  # wall clock, like the answers' times
    after_s: float  # since the enqueue began
    items_final: int
    restart_s: float


@dataclass
class Progress:
    """Items ended so far, by status; `changed` is set whenever one ends."""

    total: int
    final: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> int:
        return sum(self.final.values())

    def on_final(self, item_id: str, status: str) -> None:
        self.final[status] += 1
        self.changed.set()


def item_request(n: int) -> dict[str, Any]:
    """The n-th item of the run, as one entry of an `items:batch` request."""
    key = f"item-{n:05d}"
    if n % WEBHOOK_EVERY == 0:
        return {
            "destination": "chaos-webhook",
            "payload": {"event": "chaos", "n": n},
            "idempotency_key": key,
        }
    email = {
        "senderAddress": "chaos@example.com",
        "recipients": {"to": [{"address": f"user{n}@example.com"}]},
        "content": {"subject": f"chaos {n}", "plainText": "storm"},
    }
    return {"destination": "chaos-email", "payload": email, "idempotency_key": key}


async def enqueue_all(http: httpx.AsyncClient) -> tuple[dict[str, str], list[str]]:
    """Enqueue every item through the API; (item id -> destination, refusals)."""
    enqueued: dict[str, str] = {}
    refused: list[str] = []
    for first in range(0, ITEMS, BATCH):
        batch = [item_request(n) for n in range(first, min(first + BATCH, ITEMS))]
        response = await http.post(f"/v1/outboxes/{OUTBOX}/items:batch", json={"items": batch})
        response.raise_for_status()
        for result in response.json()["results"]:
            request = batch[result["index"]]
            if result["status"] == 202:
                enqueued[result["item"]["id"]] = request["destination"]
            else:
                refused.append(f"{request['idempotency_key']}: HTTP {result['status']}")
    return enqueued, refused


async def start_in_thread(
    children: list[Child], env: dict[str, str], stopping: threading.Event
) -> None:
    """`devstack.dev.start` off the event loop (it blocks), so the in-process fake keeps serving."""
    job = asyncio.ensure_future(asyncio.to_thread(start, children, env, LOG_DIR, stopping))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        stopping.set()  # start() notices within 0.2 s and gives up
        with contextlib.suppress(Exception):
            await job
        raise


async def kill_worker_at_random_moments(
    worker: Child,
    env: dict[str, str],
    progress: Progress,
    results: asyncio.Task[dict[str, str]],
    rng: random.Random,
    stopping: threading.Event,
    began: float,
) -> list[Kill]:
    """SIGKILL the worker KILLS times, each when a random share (5-80%) of the items has ended
    plus a random 0-2 s, and start a new one each time."""
    kills: list[Kill] = []
    for share in sorted(rng.uniform(0.05, 0.8) for _ in range(KILLS)):
        while progress.done < share * progress.total and not results.done():
            progress.changed.clear()
            await progress.changed.wait()
        await asyncio.sleep(rng.uniform(0, 2))
        if results.done():
            break
        assert worker.process is not None
        worker.process.kill()
        killed_at, after_s, items_final = time.time(), time.monotonic() - began, progress.done
        await asyncio.to_thread(worker.process.wait)
        worker.ready_line_seen.clear()  # the new process must say it is ready itself
        restarting = time.monotonic()
        await start_in_thread([worker], env, stopping)
        kill = Kill(
            killed_at, round(after_s, 1), items_final, round(time.monotonic() - restarting, 1)
        )
        kills.append(kill)
        print(
            f"  {after_s:5.0f} s: SIGKILL #{len(kills)} of the worker with {items_final}/"
            f"{progress.total} items final; a new worker was ready {kill.restart_s} s later",
            flush=True,
        )
    return kills


async def alternate_retry_after_form(state: FakeProviderState) -> None:
    """Flip the fake's 429s between seconds and HTTP-date without resetting its random draws."""
    while True:
        await asyncio.sleep(RETRY_AFTER_FORM_PERIOD_S)
        state.faults = dataclasses.replace(
            state.faults, retry_after_http_date=not state.faults.retry_after_http_date
        )


async def report_progress(progress: Progress, state: FakeProviderState, began: float) -> None:
    while True:
        await asyncio.sleep(10)
        submits = sum(stats.submits for stats in state.keys.values())
        polls = sum(stats.polls for stats in state.keys.values())
        print(
            f"  {time.monotonic() - began:5.0f} s: {progress.done}/{progress.total} final "
            f"{dict(progress.final)}; provider saw {submits} submits, {polls} polls",
            flush=True,
        )


async def read_model(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """Every item of the outbox as the API lists it from the read model, by id."""
    rows: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = (await http.get(f"/v1/outboxes/{OUTBOX}/items", params=params)).json()
        rows.update({row["id"]: row for row in page["items"]})
        cursor = page.get("next_cursor")
        if not cursor:
            return rows


async def read_model_outcomes(
    http: httpx.AsyncClient,
    item_ids: list[str],
    timeout_s: float,
    on_final: Callable[[str, str], None],
) -> dict[str, str]:
    """Bulk mode's `outcomes`: an item has no workflow of its own, so its end is what the read
    model says (the shard writes it); `UNFINISHED` for any not final after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    final: dict[str, str] = {}
    while True:
        rows = await read_model(http)
        for item_id in item_ids:
            status = rows.get(item_id, {}).get("status")
            if item_id not in final and status in FINAL_STATUSES:
                final[item_id] = status
                on_final(item_id, status)
        if len(final) == len(item_ids) or time.monotonic() > deadline:
            return {item_id: final.get(item_id, UNFINISHED) for item_id in item_ids}
        await asyncio.sleep(1)


def request_paths(destination: Destination) -> dict[str, tuple[str, float]]:
    """The fake's path prefix and configured rate of each of the destination's task queues."""
    settings = destination.settings
    if destination.provider == "acs-email":
        base = urlsplit(str(settings["endpoint"])).path.rstrip("/")
        return {
            "submit": (f"{base}/emails:send", destination.submit_rate),
            "poll": (f"{base}/emails/operations/", destination.poll_rate),
        }
    return {"submit": (urlsplit(str(settings["url"])).path, destination.submit_rate)}


def queue_traffic(state: FakeProviderState, registry: DestinationRegistry) -> list[QueueTraffic]:
    """Every request the fake saw, split by destination queue, with each queue's rate."""
    return [
        QueueTraffic(
            f"{destination.name} {queue}",
            rate,
            tuple(at for at, path in state.requests if path.startswith(prefix)),
        )
        for destination in registry
        for queue, (prefix, rate) in request_paths(destination).items()
    ]


def gather(
    enqueued: dict[str, str],
    results: dict[str, str],
    rows: dict[str, dict[str, Any]],
    state: FakeProviderState,
    answers: SubmitAnswers,
    kills: list[Kill],
    refused: list[str],
    registry: DestinationRegistry,
) -> ChaosRun:
    """What the run saw of every item at the provider, in its workflow and in the read model."""
    items = []
    for item_id in enqueued:
        key = provider_idempotency_key(item_id)
        stats = state.keys.get(key)
        operation = state.operations.get(key)
        row = rows.get(item_id) or {}
        items.append(
            ItemEvidence(
                item_id=item_id,
                outcome=results[item_id],
                deliveries=stats.deliveries if stats is not None else 0,
                provider_failed=operation is not None and operation.result != "Succeeded",
                read_model_status=row.get("status"),
                last_error=row.get("last_error"),
                answers=tuple(answers.by_key.get(key, [])),
            )
        )
    return ChaosRun(
        items=tuple(items),
        queues=tuple(queue_traffic(state, registry)),
        kill_times=tuple(kill.at for kill in kills),
        kills_planned=KILLS,
        enqueue_refusals=tuple(f"enqueue refused {refusal}" for refusal in refused),
    )


def summarise(
    run: ChaosRun, verdict: Verdict, state: FakeProviderState, answers: SubmitAnswers
) -> dict[str, Any]:
    """The run's figures for the table and `.bench/chaos.json`."""
    counts = {check.name: check.count for check in verdict.checks}
    all_answers = list(answers.all())
    retry_afters = [a.retry_after for a in all_answers if a.status == 429 and a.retry_after]
    rates = {
        rate.name: {
            "limit_per_s": rate.limit_per_s,
            **{f"max_in_{w.window_s:g}s": w.busiest for w in rate.windows},
            **{f"allowed_in_{w.window_s:g}s": w.allowed for w in rate.windows},
            "violation": rate.violation,
        }
        for rate in verdict.rates
    }
    return {
        "items": ITEMS,
        "enqueued": len(run.items),
        "enqueue_refused": counts["enqueue_refused"],
        "sent": verdict.outcomes.get("sent", 0),
        "failed": verdict.outcomes.get("failed", 0),
        "failed_expected": verdict.failed_expected,
        "failed_unexpected": counts["failed_unexpected"],
        "sent_but_provider_failed": counts["sent_but_provider_failed"],
        "unfinished": verdict.outcomes.get(UNFINISHED, 0),
        "lost": counts["lost"],
        "duplicates": counts["duplicates"],
        "resubmits_after_kill": len(verdict.resubmitted_after_kill),
        "resubmitted_items": list(verdict.resubmitted_after_kill),
        "early_requests": counts["early_requests"],
        "readmodel_mismatches": counts["readmodel_mismatches"],
        "provider": {
            "submits": sum(stats.submits for stats in state.keys.values()),
            "polls": sum(stats.polls for stats in state.keys.values()),
            "answered_5xx": sum(1 for a in all_answers if a.status == 503),
            "answered_429_seconds": sum(1 for value in retry_afters if value.isdigit()),
            "answered_429_http_date": sum(1 for value in retry_afters if not value.isdigit()),
            "hung": sum(1 for a in all_answers if a.status == 504),
            "accepted": sum(1 for a in all_answers if a.accepted),
            "operations_failed": verdict.operations_failed_by_provider,
        },
        "rates": rates,
        "worker_kills": len(run.kill_times),
        "checks": {
            check.name: {"count": check.count, "passed": check.passed} for check in verdict.checks
        },
    }


async def storm(
    children: list[Child],
    env: dict[str, str],
    state: FakeProviderState,
    answers: SubmitAnswers,
    stopping: threading.Event,
) -> tuple[dict[str, Any], list[str]]:
    registry = load_destinations(CONFIG, env)
    client = await Client.connect(env["TEMPORAL_ADDRESS"])
    worker = next(child for child in children if child.name == "worker")
    await FakeProviderAdmin(env["FAKE_PROVIDER_URL"]).set_faults(**dataclasses.asdict(STORM))
    background: list[asyncio.Task[Any]] = [asyncio.create_task(alternate_retry_after_form(state))]
    api = f"http://127.0.0.1:{env['DEV_API_PORT']}"
    try:
        async with httpx.AsyncClient(base_url=api, timeout=60) as http:
            began = time.monotonic()
            enqueued, refused = await enqueue_all(http)
            print(
                f"enqueued {len(enqueued)} items through the API in "
                f"{time.monotonic() - began:.1f} s",
                flush=True,
            )
            progress = Progress(total=len(enqueued))
            background.append(asyncio.create_task(report_progress(progress, state, began)))
            results = asyncio.create_task(
                outcomes(client, list(enqueued), DEADLINE_S, progress.on_final)
                if MODE == "item"
                else read_model_outcomes(http, list(enqueued), DEADLINE_S, progress.on_final)
            )
            background.append(results)
            # Items left unfinished at the deadline never call on_final: wake the killer anyway.
            results.add_done_callback(lambda _: progress.changed.set())
            kills = await kill_worker_at_random_moments(
                worker, env, progress, results, random.Random(SEED), stopping, began
            )
            final = await results
            seconds_to_final = round(time.monotonic() - began, 1)
            rows = await read_model(http)
    finally:
        for task in background:
            task.cancel()
    chaos_run = gather(enqueued, final, rows, state, answers, kills, refused, registry)
    verdict = judge(chaos_run)
    report = summarise(chaos_run, verdict, state, answers)
    report["kills"] = [
        {"after_s": kill.after_s, "items_final": kill.items_final, "restart_s": kill.restart_s}
        for kill in kills
    ]
    report["seconds_to_final"] = seconds_to_final
    return report, verdict.problems


async def run(children: list[Child], env: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Serve the fake here, start the stack, run the storm, stop the stack (also on SIGTERM)."""
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    state = FakeProviderState(DEFAULT_ACS_ACCESS_KEY, DEFAULT_WEBHOOK_SECRET, FaultConfig())
    answers = SubmitAnswers(create_app(state))
    stopping = threading.Event()
    async with serve_in_background(answers) as fake_url:
        env["FAKE_PROVIDER_URL"] = fake_url
        try:
            await start_in_thread(children, env, stopping)
            print(f"stack up (fake provider in this process at {fake_url})", flush=True)
            return await storm(children, env, state, answers, stopping)
        finally:
            stopping.set()
            await asyncio.to_thread(stop, children)


def print_table(report: dict[str, Any], problems: list[str]) -> None:
    provider = report["provider"]
    lines = [
        (
            "items",
            f"{report['items']} ({report['enqueued']} enqueued, "
            f"{report['enqueue_refused']} refused)",
        ),
        ("sent", report["sent"]),
        (
            "failed",
            f"{report['failed']} ({report['failed_expected']} expected: the provider "
            f"failed the operation; {report['failed_unexpected']} unexpected)",
        ),
        ("sent though the provider failed it", report["sent_but_provider_failed"]),
        ("lost", f"{report['lost']} ({report['unfinished']} not final after {DEADLINE_S:g} s)"),
        ("duplicates", report["duplicates"]),
        ("re-submits after a kill (deduped)", report["resubmits_after_kill"]),
        ("requests before a Retry-After", report["early_requests"]),
        ("read model disagrees", report["readmodel_mismatches"]),
        (
            "worker SIGKILLs",
            f"{report['worker_kills']} at "
            + ", ".join(f"{k['after_s']} s ({k['items_final']} final)" for k in report["kills"]),
        ),
        (
            "provider saw",
            f"{provider['submits']} submits ({provider['answered_5xx']} 5xx, "
            f"{provider['answered_429_seconds']} 429 Retry-After seconds, "
            f"{provider['answered_429_http_date']} 429 HTTP-date, {provider['hung']} hung, "
            f"{provider['accepted']} accepted), {provider['polls']} polls, "
            f"{provider['operations_failed']} operations failed",
        ),
        ("enqueue to all final", f"{report['seconds_to_final']} s"),
        ("runtime", f"{report['runtime_s']} s"),
    ]
    print("\n| metric | value |\n|---|---|")
    for name, value in lines:
        print(f"| {name} | {value} |")
    print(
        "\n| destination queue | limit/s | max in 1 s (allowed) | max in 10 s (allowed) | |\n"
        "|---|---|---|---|---|"
    )
    for queue, row in report["rates"].items():
        print(
            f"| {queue} | {row['limit_per_s']:g} | {row['max_in_1s']} ({row['allowed_in_1s']}) "
            f"| {row['max_in_10s']} ({row['allowed_in_10s']}) "
            f"| {'VIOLATION' if row['violation'] else 'ok'} |"
        )
    print(f"\nallowed = limit x (window + {BURST_S:g} s of server burst)")
    for note in report["resubmitted_items"]:
        print(f"re-submitted after a kill: {note}")
    if problems:
        print(f"\nFAILED: {len(problems)} problem(s)")
        for problem in problems[:30]:
            print(f"  {problem}")
    else:
        print("\nPASSED: nothing lost, nothing duplicated, no rate exceeded, no early retry")


def main() -> int:
    began = time.monotonic()
    data_dir = CHAOS_DIR / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {**os.environ, **PORTS}
    env.update(
        {
            "DEV_DATA_DIR": str(data_dir),
            "DATABASE_URL": f"sqlite:///{data_dir / 'readmodel.db'}",
            "OUTBOX_CONFIG": str(CONFIG),
            "API_TOKEN": "",
            # Plain payloads: the run reads items' results with a plain client.
            "PAYLOAD_KEYS": "",
            "DEST_CHAOS_EMAIL_MODE": MODE,
            "DEST_CHAOS_WEBHOOK_MODE": MODE,
        }
    )
    if MODE == "item":
        # Email submits make the first polls (poll_in_submit): the rate check then tests that
        # the provider sees no more than poll_rate polls from both queues together, and the
        # kills land in submits that hold their first poll too.
        env["DEST_CHAOS_EMAIL_POLL_IN_SUBMIT"] = "true"
    if MODE == "bulk":
        # Email submits and polls share activities, as large as their rates allow (a quarter
        # of the rate): the rate check then tests that a batching destination's provider
        # still sees no more than its rates.
        env["DEST_CHAOS_EMAIL_POLL_BATCH"] = "5"
        env["DEST_CHAOS_EMAIL_SUBMIT_BATCH"] = "2"
    children = [child for child in build_children(env) if child.name != "fake"]
    info = {
        **machine(),
        "mode": "quick" if QUICK else "full",
        "seed": str(SEED),
        "delivery_mode": MODE,
    }
    print(f"machine: {info}", flush=True)
    print(f"chaos ({MODE} mode): {ITEMS} items, storm {STORM}, {KILLS} worker SIGKILLs", flush=True)
    try:
        figures, problems = asyncio.run(run(children, env))
    except StartupError as err:
        print(f"chaos: {err} (see {LOG_DIR})", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaos: interrupted; the stack is stopped", file=sys.stderr)
        return 130
    report = {"machine": info, **figures, "runtime_s": round(time.monotonic() - began, 1)}
    report["passed"] = not problems
    report["problems"] = problems
    REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    REPORT_PATH.write_text(json.dumps(report, indent=2))
    print_table(report, problems)
    print(f"\nwritten to {REPORT_PATH}; logs in {LOG_DIR}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
