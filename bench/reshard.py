"""`make chaos`, after the lane runs (or `python -m bench.reshard`): a bulk destination's `shards`
changed in a rolling restart, under load, with workers SIGKILLed.

A stack of its own: a dev server on a SQLite file, the fake provider in this process (1% of
submits answered 503), and the release's worker and API in two generations that differ only in
the destination's `shards` (`DEST_RESHARD_WEBHOOK_SHARDS`): the old generation at RESHARD_FROM
(2), the new at RESHARD_TO (4; `make chaos` also runs 4 to 2), two API processes on the one read
model while both run. RESHARD_PRODUCERS producers each send
ordering lanes of RESHARD_LANE_ITEMS items, one lane after another, each enqueue awaited before
the next, to the APIs that are up in turn; a request that fails (a refused connection, a 5xx) is
sent again to another API with the same idempotency key, as a client behind a load balancer
would. Unordered items go to every API that is up at once, under one key: a retried request that
reached both. Meanwhile the rollout, each step once RESHARD_STEP_ENQUEUES more items were enqueued:

1. the new generation's worker and API start beside the old;
2. the old worker is SIGKILLed and a second new worker starts in its place;
3. the old API is stopped (SIGTERM): producers find it gone and go to the new one;
4. a new worker is SIGKILLed and started again.

After one more step's worth of enqueues each producer finishes its lane and stops. Then at the
fake: every item arrived exactly once, each lane's items in the order they were sent, and no item
was submitted again after a later item of its lane had arrived unless a worker was killed in
between (`bench.lane_scale`'s judge); in the read model every item ended `sent`. The run must
also have tested the change: owners routed by each count, and a lane whose items both
generations' APIs accepted where the two counts place it on different shards. Prints its report,
writes `.bench/reshard-{from}-{to}.json`, and exits 1 on any problem.

Environment: RESHARD_FROM, RESHARD_TO, RESHARD_PRODUCERS, RESHARD_LANE_ITEMS,
RESHARD_STEP_ENQUEUES, RESHARD_STALL_S (the run fails if no item ends for this long),
RESHARD_SEED (the fake's fault draws; printed),
RESHARD_READ_MODEL (`sqlite`, the default, or `postgres`: a scratch database on the machine's
PostgreSQL, where routes are claimed by concurrent transactions of both API processes and the
workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from durable_outbox_temporal.contract.bulk import MAX_SHARDS, shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import (
    item_workflow_id,
    lane_workflow_id,
    provider_idempotency_key,
)
from sqlalchemy import Engine, select
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from bench.chaos import LOG_DIR, Progress, SubmitAnswers, report_progress, start_in_thread
from bench.chaos_analysis import SubmitAnswer
from bench.lane_scale import Ends, findings_problems, judge_arrivals
from bench.run import machine
from bench.upgrade import fresh_database
from bench.verdict import verdict
from configuration.settings import PROJECT_ROOT
from devstack.dev import Child, StartupError, build_children, stop
from devstack.fake_provider import (
    DEFAULT_ACS_ACCESS_KEY,
    DEFAULT_WEBHOOK_SECRET,
    FakeProviderState,
    FaultConfig,
    create_app,
)
from devstack.serving import serve_in_background
from readmodel.db import make_engine
from readmodel.models import BULK_ROUTES

QUICK = os.environ.get("QUICK") == "1"
PRODUCERS = int(os.environ.get("RESHARD_PRODUCERS") or (6 if QUICK else 12))
LANE_ITEMS = int(os.environ.get("RESHARD_LANE_ITEMS") or 20)
STEP_ENQUEUES = int(os.environ.get("RESHARD_STEP_ENQUEUES") or (100 if QUICK else 300))
STALL_S = float(os.environ.get("RESHARD_STALL_S") or 120)
READ_MODELS = ("sqlite", "postgres")
READ_MODEL = os.environ.get("RESHARD_READ_MODEL") or "sqlite"
POSTGRES_URL = os.environ.get(
    "READMODEL_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SEED = int(os.environ.get("RESHARD_SEED") or random.randrange(1_000_000))
# The count the old generation runs with and the new one's (lower, for a run that lowers it).
OLD_SHARDS = int(os.environ.get("RESHARD_FROM") or 2)
NEW_SHARDS = int(os.environ.get("RESHARD_TO") or 4)
ERROR_RATE = 0.01
# Each producer rests this long after each confirmed enqueue, so the enqueues span the rollout
# (whose steps wait for processes to start) on a slow machine without a backlog of minutes.
PRODUCER_PAUSE_S = 0.2
# An unordered item goes to every API that is up this often.
UNORDERED_EVERY_S = 0.25
# A request is sent again this many times (to the next API up, or after a pause) before the run
# gives the item up as a problem.
REQUEST_ATTEMPTS = 50
RETRY_PAUSE_S = 0.2
OUTBOX = "reshard"
DESTINATION = "reshard-webhook"
SHARDS_VARIABLE = "DEST_RESHARD_WEBHOOK_SHARDS"
DATA_DIR = PROJECT_ROOT / ".bench" / "reshard"
RESULT = PROJECT_ROOT / ".bench" / f"reshard-{OLD_SHARDS}-{NEW_SHARDS}.json"
# Clear of `make dev`, `make bench`, `bench.chaos` and `bench.lane_scale`.
TEMPORAL_PORT, UI_PORT, OLD_API_PORT, NEW_API_PORT = "7273", "8273", "8040", "8041"


def destinations_toml() -> str:
    """The run's destinations file: one bulk webhook at the fake, fast enough never to be the
    limit; its `shards` comes from each generation's environment."""
    return f"""# Written by bench/reshard.py for one run.
[destinations.{DESTINATION}]
provider = "webhook"
mode = "bulk"
shards = {OLD_SHARDS}
submit_batch = 100
submit_rate = 1000
backoff_initial_s = 0.2
backoff_max_s = 1
# A submit that was out on a killed worker is tried again after this (default 30 s).
submit_timeout_s = 5
# No delivery reports reach a benchmark: a sent item ends at once.
report_window_s = 0

[destinations.{DESTINATION}.settings]
url = "${{FAKE_PROVIDER_URL}}/webhook/{DESTINATION}"
secret = "{DEFAULT_WEBHOOK_SECRET}"
"""


def lane_key(producer: int, lane: int) -> str:
    return f"p{producer}-l{lane}"


def ordered_item_key(lane: str, i: int) -> str:
    return f"{lane}-{i}"


def unordered_item_key(n: int) -> str:
    return f"u-{n}"


@dataclass
class Fleet:
    """The API processes producers may send to, and what they sent."""

    apis: list[str]
    enqueued: int = 0  # ordered items confirmed
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lanes: list[str] = field(default_factory=list)  # every lane begun, in order
    unordered: int = 0
    retried_requests: int = 0
    answered_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # The APIs that accepted each lane's items.
    lane_apis: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    problems: list[str] = field(default_factory=list)

    def confirmed(self) -> None:
        self.enqueued += 1
        self.changed.set()

    def gave_up(self, problem: str) -> None:
        self.problems.append(problem)
        self.changed.set()

    async def enqueued_at_least(self, count: int) -> None:
        """Raises GaveUp once a producer has given an item up: the count may never come."""
        while self.enqueued < count:
            if self.problems:
                raise GaveUp
            self.changed.clear()
            await self.changed.wait()


class GaveUp(Exception):
    """A producer gave an item up; the rollout stops where it is."""


async def send_once(
    http: httpx.AsyncClient, fleet: Fleet, key: str, body: dict[str, Any], first: int
) -> str | None:
    """POST one item under idempotency key `key` to the APIs up, starting at index `first` and
    going round on a failure; the API that accepted it, None if none did."""
    for attempt in range(REQUEST_ATTEMPTS):
        apis = list(fleet.apis)
        api = apis[(first + attempt) % len(apis)]
        try:
            response = await http.post(
                f"{api}/v1/outboxes/{OUTBOX}/items", json=body, headers={"Idempotency-Key": key}
            )
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code in (200, 202):
            fleet.answered_by[api] += 1
            return api
        if response is not None and response.status_code < 500 and response.status_code != 429:
            fleet.gave_up(f"{key}: HTTP {response.status_code} {response.text[:200]}")
            return None
        fleet.retried_requests += 1
        await asyncio.sleep(RETRY_PAUSE_S)
    fleet.gave_up(f"{key}: refused {REQUEST_ATTEMPTS} times")
    return None


async def produce(
    http: httpx.AsyncClient, fleet: Fleet, producer: int, stop_after: asyncio.Event
) -> None:
    """Lanes of LANE_ITEMS items, one after another, until `stop_after` is set at a lane's end."""
    lane_number = 0
    while not stop_after.is_set():
        lane = lane_key(producer, lane_number)
        fleet.lanes.append(lane)
        for i in range(LANE_ITEMS):
            key = ordered_item_key(lane, i)
            body = {
                "destination": DESTINATION,
                "payload": {"lane": lane, "i": i},
                "ordering_key": lane,
            }
            # Each item starts at the next API: a lane's items reach both generations.
            api = await send_once(http, fleet, key, body, first=i)
            if api is None:
                return
            fleet.lane_apis[lane].add(api)
            fleet.confirmed()
            await asyncio.sleep(PRODUCER_PAUSE_S)
        lane_number += 1


async def produce_unordered(http: httpx.AsyncClient, fleet: Fleet, stop: asyncio.Event) -> None:
    """An item at a time to every API up at once, under one idempotency key."""
    while not stop.is_set():
        key = unordered_item_key(fleet.unordered)
        body = {
            "destination": DESTINATION,
            "payload": {"u": fleet.unordered},
        }
        fleet.unordered += 1
        sent = await asyncio.gather(
            *(send_once(http, fleet, key, body, first=n) for n in range(len(fleet.apis)))
        )
        if not any(sent):
            return
        await asyncio.sleep(UNORDERED_EVERY_S)


@dataclass
class Generation:
    """One release's worker and API processes, with their environment."""

    env: dict[str, str]
    children: list[Child]

    def named(self, name: str) -> Child:
        return next(child for child in self.children if child.name == name)


def generation(base: dict[str, str], shards: int, api_port: str, tag: str) -> Generation:
    """The worker and API of a generation at `shards`, named `worker-{tag}`, `api-{tag}`, and a
    second worker `worker-{tag}-2`."""
    env = {**base, "DEV_API_PORT": api_port, SHARDS_VARIABLE: str(shards)}
    first = build_children(env)
    second = build_children(dict(env))
    children = [
        dataclasses.replace(_child(first, "worker"), name=f"worker-{tag}"),
        dataclasses.replace(_child(first, "api"), name=f"api-{tag}"),
        dataclasses.replace(_child(second, "worker"), name=f"worker-{tag}-2"),
    ]
    return Generation(env, children)


def _child(children: list[Child], name: str) -> Child:
    return next(child for child in children if child.name == name)


@dataclass
class Step:
    name: str
    after_s: float
    enqueued: int
    took_s: float


async def sigkill(child: Child) -> float:
    """SIGKILL `child`; the wall time, as the provider's answers are timed."""
    assert child.process is not None
    child.process.kill()
    at = time.time()
    await asyncio.to_thread(child.process.wait)
    child.ready_line_seen.clear()
    return at


async def roll_out(
    old: Generation,
    new: Generation,
    fleet: Fleet,
    stopping: threading.Event,
    began: float,
    steps: list[Step],
    kills: list[float],
) -> None:
    """The four steps of the module's docstring, each appended to `steps` once taken, each
    SIGKILL's wall time to `kills`; raises GaveUp if a producer gives an item up."""
    new_api = f"http://127.0.0.1:{NEW_API_PORT}"
    old_api = f"http://127.0.0.1:{OLD_API_PORT}"

    async def step(name: str, action: Any) -> None:
        await fleet.enqueued_at_least(fleet.enqueued + STEP_ENQUEUES)
        at, enqueued = time.monotonic(), fleet.enqueued
        await action()
        steps.append(Step(name, round(at - began, 1), enqueued, round(time.monotonic() - at, 1)))
        print(f"  {at - began:5.0f} s ({enqueued} enqueued): {name}", flush=True)

    async def new_generation() -> None:
        await start_in_thread([new.named("worker-new"), new.named("api-new")], new.env, stopping)
        fleet.apis.append(new_api)

    async def replace_old_worker() -> None:
        kills.append(await sigkill(old.named("worker-old")))
        await start_in_thread([new.named("worker-new-2")], new.env, stopping)

    async def stop_old_api() -> None:
        # Stopped first, taken out of the producers' list once gone: requests meanwhile fail
        # and are sent again to the new API.
        await asyncio.to_thread(stop, [old.named("api-old")])
        fleet.apis.remove(old_api)

    async def kill_a_new_worker() -> None:
        worker = new.named("worker-new")
        kills.append(await sigkill(worker))
        await start_in_thread([worker], new.env, stopping)

    await step(f"new worker and API up (shards {NEW_SHARDS}) beside the old", new_generation)
    await step("old worker SIGKILLed, a second new worker up", replace_old_worker)
    await step("old API stopped", stop_old_api)
    await step("a new worker SIGKILLed and started again", kill_a_new_worker)
    await fleet.enqueued_at_least(fleet.enqueued + STEP_ENQUEUES)


def routes_of(engine: Engine) -> dict[str, int]:
    """Each owner of the destination's count, by its route."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(BULK_ROUTES.c.owner, BULK_ROUTES.c.shards).where(
                BULK_ROUTES.c.destination == DESTINATION
            )
        )
        return {str(owner): int(shards) for owner, shards in rows}


def lanes_across_counts(routes: dict[str, int], lane_apis: dict[str, set[str]]) -> int:
    """Lanes whose items both generations' APIs accepted and which the two counts place on
    different shards: where a sender going by its own count would have split the lane."""
    across = 0
    for lane, apis in lane_apis.items():
        owner = lane_workflow_id(OUTBOX, lane)
        if len(apis) < 2 or owner not in routes:
            continue
        if shard_of(owner, OLD_SHARDS) != shard_of(owner, NEW_SHARDS):
            across += 1
    return across


async def shards_started(client: Client) -> list[int]:
    """The destination's shards that have a workflow."""
    started = []
    for n in range(max(OLD_SHARDS, NEW_SHARDS)):
        try:
            await client.get_workflow_handle(shard_workflow_id(DESTINATION, n)).describe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            continue
        started.append(n)
    return started


@dataclass(frozen=True)
class Sent:
    """What the producers had confirmed: lanes (each LANE_ITEMS items) and unordered items."""

    lanes: Sequence[str]
    unordered: int

    @property
    def keys(self) -> list[str]:
        return [
            *(ordered_item_key(lane, i) for lane in self.lanes for i in range(LANE_ITEMS)),
            *(unordered_item_key(n) for n in range(self.unordered)),
        ]


def judge(
    sent: Sent,
    delivery_log: Sequence[dict[str, Any]],
    answers: SubmitAnswers,
    kills: Sequence[float],
) -> tuple[dict[str, Any], list[str]]:
    """The provider's view of the run: the lanes by `bench.lane_scale`'s judge (a lane is an
    appender there), the unordered items by count."""
    lane_index = {lane: n for n, lane in enumerate(sent.lanes)}
    arrivals = []
    unordered_seen: dict[int, int] = defaultdict(int)
    for entry in delivery_log:
        payload = entry["payload"] or {}
        if entry["endpoint"] != DESTINATION:
            continue
        if "lane" in payload and payload["lane"] in lane_index:
            arrivals.append((lane_index[payload["lane"]], payload["i"], entry["at"]))
        elif "u" in payload:
            unordered_seen[payload["u"]] += 1
    by_provider_key = {
        provider_idempotency_key(item_workflow_id(OUTBOX, ordered_item_key(lane, i))): (n, i)
        for lane, n in lane_index.items()
        for i in range(LANE_ITEMS)
    }
    submits: dict[tuple[int, int], list[SubmitAnswer]] = {
        by_provider_key[key]: list(found)
        for key, found in answers.by_key.items()
        if key in by_provider_key
    }
    findings = judge_arrivals(len(sent.lanes), LANE_ITEMS, arrivals, submits, kills)
    resubmitted = unordered_resubmits(sent.unordered, answers, kills)
    problems = findings_problems(findings, len(sent.lanes) * LANE_ITEMS)
    unordered_lost = sum(1 for n in range(sent.unordered) if n not in unordered_seen)
    unordered_twice = sum(count - 1 for count in unordered_seen.values())
    if unordered_lost:
        problems.append(f"{unordered_lost} of {sent.unordered} unordered items never arrived")
    if unordered_twice:
        problems.append(f"{unordered_twice} unordered items arrived twice")
    if resubmitted:
        problems.append(
            f"{resubmitted} unordered items accepted twice by the provider with no worker kill "
            "between (two shards held one item: only the provider's idempotency window kept "
            "it from being sent twice)"
        )
    return {
        "lanes": len(sent.lanes),
        "ordered_items": len(sent.lanes) * LANE_ITEMS,
        "unordered_items": sent.unordered,
        "delivered": findings.delivered + len(unordered_seen),
        "lost": findings.lost + unordered_lost,
        "duplicates": findings.duplicates + unordered_twice,
        "out_of_order": findings.out_of_order,
        "late_submits": findings.late_submits,
        "late_resubmits_after_kills": findings.late_resubmits_after_kills,
        "resubmits_deduped": findings.resubmits_deduped,
        "unordered_resubmits": resubmitted,
    }, problems


def unordered_resubmits(count: int, answers: SubmitAnswers, kills: Sequence[float]) -> int:
    """Unordered items the provider accepted more than once with no worker kill between the
    first acceptance and a later one (after a kill, a batch out on the killed worker is sent
    again whole, as `bench.chaos` allows)."""
    resubmitted = 0
    for n in range(count):
        key = provider_idempotency_key(item_workflow_id(OUTBOX, unordered_item_key(n)))
        accepted = [answer.arrived_at for answer in answers.by_key.get(key, ()) if answer.accepted]
        if any(not any(accepted[0] <= kill <= later for kill in kills) for later in accepted[1:]):
            resubmitted += 1
    return resubmitted


def coverage_problems(routes_by_count: dict[int, int], across: int) -> list[str]:
    """A run that never routed owners by both counts, or sent no lane through both generations
    where their counts disagree on its shard, tested nothing of the change."""
    problems = [
        f"no owner was routed by shards = {count}"
        for count in (OLD_SHARDS, NEW_SHARDS)
        if not routes_by_count.get(count)
    ]
    if not across:
        problems.append(
            "no lane had items accepted by both generations' APIs where their counts place it "
            "on different shards"
        )
    return problems


async def rolling_restart(
    old: Generation,
    new: Generation,
    env: dict[str, str],
    state: FakeProviderState,
    answers: SubmitAnswers,
    stopping: threading.Event,
) -> tuple[dict[str, Any], list[str]]:
    fleet = Fleet(apis=[f"http://127.0.0.1:{OLD_API_PORT}"])
    done_producing = asyncio.Event()
    began = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as http:
        producing = asyncio.gather(
            *(produce(http, fleet, p, done_producing) for p in range(PRODUCERS)),
            produce_unordered(http, fleet, done_producing),
        )
        steps: list[Step] = []
        kills: list[float] = []
        try:
            with contextlib.suppress(GaveUp):  # the item given up is in fleet.problems
                await roll_out(old, new, fleet, stopping, began, steps, kills)
            done_producing.set()
            await producing
        finally:
            # A step that failed (a process that would not start) leaves producers sending.
            if not producing.done():
                producing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await producing
    enqueue_s = time.monotonic() - began
    sent = Sent(tuple(fleet.lanes), fleet.unordered)
    print(
        f"  {enqueue_s:5.0f} s: {len(sent.lanes)} lanes ({len(sent.lanes) * LANE_ITEMS} items) "
        f"and {sent.unordered} unordered items enqueued; waiting for their ends",
        flush=True,
    )
    engine = make_engine(env["DATABASE_URL"])
    keys = sent.keys
    progress = Progress(total=len(keys))
    reporter = asyncio.create_task(report_progress(progress, state, began))
    # A run whose producer gave an item up has failed already: its report comes at once.
    unfinished: asyncio.Future[None] = asyncio.Future()
    if fleet.problems:
        unfinished.cancel()
    try:
        final = await Ends(engine, len(keys), progress, OUTBOX).wait(unfinished)
    finally:
        reporter.cancel()
    elapsed = time.monotonic() - began
    routes = routes_of(engine)
    engine.dispose()
    by_count = dict(Counter(routes.values()))
    across = lanes_across_counts(routes, fleet.lane_apis)
    client = await Client.connect(env["TEMPORAL_ADDRESS"])
    shards = await shards_started(client)
    figures, problems = judge(sent, state.delivery_log, answers, kills)
    problems = [*fleet.problems, *problems, *coverage_problems(by_count, across)]
    not_sent = sorted(key for key in keys if final.get(key) != "sent")
    if not_sent:
        problems.append(
            f"{len(not_sent)} items not sent in the read model (first: {not_sent[:5]}; "
            f"no item ended for {STALL_S:g} s)"
        )
    report = {
        **machine(),
        "run": "quick" if QUICK else "full",
        "read_model": READ_MODEL,
        "seed": SEED,
        "producers": PRODUCERS,
        "lane_items": LANE_ITEMS,
        **figures,
        "retried_requests": fleet.retried_requests,
        "answered_by": dict(fleet.answered_by),
        "from_shards": OLD_SHARDS,
        "to_shards": NEW_SHARDS,
        "routes_by_shards": {str(count): owners for count, owners in sorted(by_count.items())},
        "lanes_across_counts": across,
        "shards_started": shards,
        "steps": [dataclasses.asdict(step) for step in steps],
        "worker_kills": len(kills),
        "enqueue_s": round(enqueue_s, 1),
        "elapsed_s": round(elapsed, 1),
        "problems": problems,
    }
    return report, problems


@contextlib.contextmanager
def read_model_database() -> Iterator[str]:
    """The run's read model: a SQLite file under the run's directory, or with
    RESHARD_READ_MODEL=postgres a scratch database on the machine's PostgreSQL (the server
    `READMODEL_POSTGRES_URL` names, as the read model's tests take it), dropped afterwards."""
    if READ_MODEL == "sqlite":
        yield f"sqlite:///{DATA_DIR / 'readmodel.db'}"
        return
    with fresh_database(POSTGRES_URL, "reshard") as database_url:
        yield database_url


async def run() -> tuple[dict[str, Any], list[str]]:
    """A fresh stack (its own data directory and read model), the rolling restart, the stack
    stopped (also on SIGTERM)."""
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    DATA_DIR.mkdir(parents=True)
    with read_model_database() as database_url:
        return await run_on(database_url)


async def run_on(database_url: str) -> tuple[dict[str, Any], list[str]]:
    began = time.monotonic()
    config = DATA_DIR / "destinations.toml"
    config.write_text(destinations_toml())
    env = {
        **os.environ,
        "DEV_DATA_DIR": str(DATA_DIR),
        "DEV_TEMPORAL_PORT": TEMPORAL_PORT,
        "DEV_UI_PORT": UI_PORT,
        "WORKER_METRICS_ADDRESS": "",
        "DATABASE_URL": database_url,
        "OUTBOX_CONFIG": str(config),
        "API_TOKEN": "",
        "PAYLOAD_KEYS": "",
    }
    temporal = _child(build_children(env), "temporal")
    old = generation(env, OLD_SHARDS, OLD_API_PORT, "old")
    new = generation(env, NEW_SHARDS, NEW_API_PORT, "new")
    state = FakeProviderState(
        DEFAULT_ACS_ACCESS_KEY,
        DEFAULT_WEBHOOK_SECRET,
        FaultConfig(error_rate=ERROR_RATE, seed=SEED),
    )
    answers = SubmitAnswers(create_app(state))
    stopping = threading.Event()
    everything = [temporal, *old.children, *new.children]
    async with serve_in_background(answers) as fake_url:
        for environment in (env, old.env, new.env):
            environment["FAKE_PROVIDER_URL"] = fake_url
        try:
            await start_in_thread([temporal], env, stopping)
            await start_in_thread(
                [old.named("worker-old"), old.named("api-old")], old.env, stopping
            )
            print(f"  stack up, shards {OLD_SHARDS} (fake provider at {fake_url})", flush=True)
            report, problems = await rolling_restart(old, new, env, state, answers, stopping)
        finally:
            stopping.set()
            await asyncio.to_thread(stop, everything)
    report["runtime_s"] = round(time.monotonic() - began, 1)
    return report, problems


def main() -> int:
    if not (1 <= OLD_SHARDS <= MAX_SHARDS and 1 <= NEW_SHARDS <= MAX_SHARDS) or (
        OLD_SHARDS == NEW_SHARDS
    ):
        print(
            f"reshard: RESHARD_FROM and RESHARD_TO must be two different counts from 1 to "
            f"{MAX_SHARDS}, not {OLD_SHARDS} and {NEW_SHARDS}",
            file=sys.stderr,
        )
        return 2
    if READ_MODEL not in READ_MODELS:
        print(
            f"reshard: RESHARD_READ_MODEL must be one of {', '.join(READ_MODELS)}, not "
            f"{READ_MODEL!r}",
            file=sys.stderr,
        )
        return 2
    print(
        f"reshard: a bulk destination from {OLD_SHARDS} to {NEW_SHARDS} shards in a rolling "
        f"restart; {PRODUCERS} producers, lanes of {LANE_ITEMS}, {ERROR_RATE:.0%} 503s, "
        f"read model on {READ_MODEL}, seed {SEED}",
        flush=True,
    )
    try:
        report, problems = asyncio.run(run())
    except StartupError as err:
        print(f"reshard: {err} (see {LOG_DIR})", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("reshard: interrupted; the stack is stopped", file=sys.stderr)
        return 130
    status = verdict("RESHARD", report, problems, RESULT)
    print(f"  logs in {LOG_DIR}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
