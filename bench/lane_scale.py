"""`make chaos` part two (or `python -m bench.lane_scale`): 10,000 items in ONE ordering lane, in
item mode and in bulk mode, with the worker SIGKILLed along the way.

Each mode gets a stack of its own, built as `bench.chaos` builds it: a dev server on a SQLite
file and the worker as processes of their own, the fake provider in this process. LANE_APPENDERS
concurrent clients append LANE_ITEMS items (10,000; 1,000 with QUICK=1) to one lane, each client
its own numbered sequence, while the provider fails 1% of submits with a 503 and the worker is
SIGKILLed at three random moments (`bench.chaos.kill_worker_at_random_moments`) and restarted.
In item mode the lane is its own workflow, whose outbox continues it as new every
`lane_history_events` (the item count, at most the default 10,000), so it must have done so at
least once; in bulk mode it lives in the shard of a 4-shard destination that owns the key. An
item ends when the read model says so (a lane's item has no workflow of its own).

Then, at the fake provider: every item arrived exactly once, each client's items arrived in the
order that client appended them (a client waits for each append before the next, so its items
are ordered in the lane), and no item was submitted again once a later item of its client had
arrived. Prints a table per mode, writes `.bench/lane_scale_{mode}.json`, and exits 1 on any
loss, duplicate, reordering, item not sent, or if the lane stops moving for LANE_STALL_S (120 s).

Environment: LANE_MODE (`item` or `bulk`; unset: both, one after the other), LANE_ITEMS,
LANE_APPENDERS, LANE_STALL_S, LANE_SEED (the fake's fault draws and the kill moments; printed).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_outbox_temporal import LaneFull, OutboxClient, connect
from durable_outbox_temporal.contract.bulk import shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import (
    WORKFLOW_TASK_QUEUE,
    item_workflow_id,
    lane_workflow_id,
    provider_idempotency_key,
)
from sqlalchemy import Engine, select
from temporalio.client import Client

from bench.chaos import (
    LOG_DIR,
    Kill,
    Progress,
    SubmitAnswers,
    kill_worker_at_random_moments,
    report_progress,
    start_in_thread,
)
from bench.chaos_analysis import SubmitAnswer
from bench.run import machine
from bench.verdict import verdict
from configuration.destinations import load_destinations
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
from readmodel.lanes import get_lane
from readmodel.models import ITEMS

QUICK = os.environ.get("QUICK") == "1"
ITEMS_IN_LANE = int(os.environ.get("LANE_ITEMS") or (1_000 if QUICK else 10_000))
APPENDERS = int(os.environ.get("LANE_APPENDERS") or 20)
# The run fails if no item of the lane ends for this long.
STALL_S = float(os.environ.get("LANE_STALL_S") or 120)
SEED = int(os.environ.get("LANE_SEED") or random.randrange(1_000_000))
MODES = ("item", "bulk")
SHARDS = 4
# Each 503 holds the lane (nothing overtakes its head) for the item's backoff: 1% keeps retries
# in the run without turning a 10,000-item lane into minutes of backoff.
ERROR_RATE = 0.01
OUTBOX = "lane-scale"
LANE = "one-lane"
DESTINATION = "lane-webhook"
FINAL_STATUSES = ("sent", "failed", "cancelled")
# A lane's default `lane_history_events` (durable_outbox_temporal/destinations.py OutboxSettings)
# and its floor.
DEFAULT_HISTORY_EVENTS, MIN_HISTORY_EVENTS = 10_000, 100
# Retries of a full lane (LaneFull, the API's 429) wait this long.
LANE_FULL_WAIT_S = 1.0
DATA_DIR = PROJECT_ROOT / ".bench" / "lane_scale"
# Clear of `make dev`, `make bench` and `bench.chaos`; the worker serves no metrics.
PORTS = {
    "DEV_TEMPORAL_PORT": "7263",
    "DEV_UI_PORT": "8263",
    "DEV_API_PORT": "8030",
    "WORKER_METRICS_ADDRESS": "",
}


def result_path(mode: str) -> Path:
    return PROJECT_ROOT / ".bench" / f"lane_scale_{mode}.json"


def history_events(items: int) -> int:
    """The outbox's `lane_history_events`: no more than the lane's item count, so an item-mode
    lane continues as new at least once whatever LANE_ITEMS is (each item costs its lane more
    than one history event)."""
    return max(MIN_HISTORY_EVENTS, min(DEFAULT_HISTORY_EVENTS, items))


def destinations_toml(mode: str, items: int) -> str:
    """The run's destinations file: one webhook at the fake, fast enough never to be the limit,
    in `mode`; and the lane's outbox."""
    # In bulk mode the lane's waiting items go to the provider in runs of up to 100.
    bulk = f'mode = "bulk"\nshards = {SHARDS}\nsubmit_batch = 100\n' if mode == "bulk" else ""
    return f"""# Written by bench/lane_scale.py for one run ({mode} mode).
[destinations.{DESTINATION}]
provider = "webhook"
submit_rate = 1000
backoff_initial_s = 0.2
backoff_max_s = 1
# A submit that was out on a killed worker is tried again after this (default 30 s).
submit_timeout_s = 5
{bulk}
[destinations.{DESTINATION}.settings]
url = "${{FAKE_PROVIDER_URL}}/webhook/{DESTINATION}"
secret = "{DEFAULT_WEBHOOK_SECRET}"

[outboxes.{OUTBOX}]
lane_history_events = {history_events(items)}
"""


def item_key(appender: int, i: int) -> str:
    return f"a{appender}-{i}"


@dataclass(frozen=True)
class Findings:
    """What the provider saw of the lane's items."""

    delivered: int  # items that arrived, once or more
    lost: int
    duplicates: int  # arrivals beyond each item's first
    out_of_order: int  # arrivals before an item its client appended earlier
    # Submits of an item that reached the provider after a later item of its client had arrived
    # (a provider that did not dedupe would have had it twice, out of order), with no worker kill
    # since the item first arrived.
    late_submits: int
    resubmits_deduped: int  # items the provider accepted more than once (and deduped)
    # The same after a kill: in bulk mode a run's activity, out on the killed worker, is retried
    # whole and sends the run's delivered items again under their idempotency keys
    # (docs/decisions/lanes-in-the-host.md), as `bench.chaos` allows a re-submit after a kill.
    late_resubmits_after_kills: int = 0


def judge_arrivals(
    appenders: int,
    per_appender: int,
    arrivals: Iterable[tuple[int, int, float]],
    submits: Mapping[tuple[int, int], Sequence[SubmitAnswer]],
    kill_times: Sequence[float] = (),
) -> Findings:
    """`arrivals`: first deliveries in arrival order, as (appender, i, wall time); `submits`:
    every answer to each item's submits, by (appender, i); `kill_times`: the worker's SIGKILLs,
    wall time."""
    seen: dict[tuple[int, int], int] = {}
    first_at: dict[tuple[int, int], float] = {}
    last: dict[int, int] = {}
    out_of_order = 0
    for appender, i, at in arrivals:
        item = (appender, i)
        seen[item] = seen.get(item, 0) + 1
        first_at.setdefault(item, at)
        if i < last.get(appender, -1):
            out_of_order += 1
        last[appender] = i
    late_submits = late_after_kills = 0
    for appender in range(appenders):
        # Walking back from the last item: the earliest arrival of any later item of the client.
        later_arrived = float("inf")
        for i in reversed(range(per_appender)):
            first = first_at.get((appender, i), float("inf"))
            for answer in submits.get((appender, i), ()):
                if answer.arrived_at <= later_arrived:
                    continue
                if any(first <= kill <= answer.arrived_at for kill in kill_times):
                    late_after_kills += 1
                else:
                    late_submits += 1
            later_arrived = min(later_arrived, first)
    return Findings(
        delivered=len(seen),
        lost=appenders * per_appender - len(seen),
        duplicates=sum(count - 1 for count in seen.values()),
        out_of_order=out_of_order,
        late_submits=late_submits,
        resubmits_deduped=sum(
            1 for answers in submits.values() if sum(a.accepted for a in answers) > 1
        ),
        late_resubmits_after_kills=late_after_kills,
    )


def findings_problems(findings: Findings, expected: int) -> list[str]:
    problems = []
    if findings.lost:
        problems.append(f"{findings.lost} of {expected} items never arrived")
    if findings.duplicates:
        problems.append(f"{findings.duplicates} duplicate deliveries")
    if findings.out_of_order:
        problems.append(
            f"{findings.out_of_order} items arrived before an item appended earlier by the same "
            "client"
        )
    if findings.late_submits:
        problems.append(
            f"{findings.late_submits} submits of an item came after a later item had arrived"
            " (no worker kill since the item's first arrival)"
        )
    return problems


class Ends:
    """Each item's end, as the read model shows it; `at` is when the last one was seen."""

    def __init__(
        self, engine: Engine, expected: int, progress: Progress, outbox: str = OUTBOX
    ) -> None:
        self.engine, self.expected, self.progress, self.outbox = engine, expected, progress, outbox
        self.final: dict[str, str] = {}
        self.at = time.monotonic()

    def _read(self) -> list[tuple[str, str]]:
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(ITEMS.c.key, ITEMS.c.status).where(
                    ITEMS.c.outbox == self.outbox, ITEMS.c.status.in_(FINAL_STATUSES)
                )
            )
            return [(str(key), str(status)) for key, status in rows]

    async def wait(self, appending: asyncio.Future[Any]) -> dict[str, str]:
        """Until every item has ended, the appends failed, or none ended for STALL_S."""
        while len(self.final) < self.expected:
            for key, status in await asyncio.to_thread(self._read):
                if key not in self.final:
                    self.final[key] = status
                    self.at = time.monotonic()
                    self.progress.on_final(key, status)
            if appending.done() and (appending.cancelled() or appending.exception()):
                break
            if time.monotonic() - self.at > STALL_S:
                break
            await asyncio.sleep(0.5)
        return self.final


async def append_all(outbox: OutboxClient, per_appender: int) -> tuple[float, int]:
    """Each appender sends its own numbered sequence, one append after another; (seconds,
    appends refused because the lane was full, each retried)."""
    refused = 0

    async def appender(a: int) -> None:
        nonlocal refused
        for i in range(per_appender):
            while True:
                try:
                    await outbox.enqueue(
                        OUTBOX,
                        DESTINATION,
                        {"appender": a, "i": i},
                        key=item_key(a, i),
                        ordering_key=LANE,
                    )
                    break
                except LaneFull:
                    refused += 1
                    await asyncio.sleep(LANE_FULL_WAIT_S)

    began = time.monotonic()
    await asyncio.gather(*(appender(a) for a in range(APPENDERS)))
    return time.monotonic() - began, refused


async def runs_of(client: Client, workflow_id: str) -> int:
    """How many runs a workflow has had (each continue-as-new starts one)."""
    query = f"WorkflowId = '{workflow_id}'"
    return len([execution async for execution in client.list_workflows(query)])


def submits_by_item(
    answers: SubmitAnswers, per_appender: int
) -> dict[tuple[int, int], list[SubmitAnswer]]:
    """The provider's answers to each item's submits, by (appender, i)."""
    by_provider_key = {
        provider_idempotency_key(item_workflow_id(OUTBOX, item_key(a, i))): (a, i)
        for a in range(APPENDERS)
        for i in range(per_appender)
    }
    return {
        by_provider_key[key]: list(found)
        for key, found in answers.by_key.items()
        if key in by_provider_key
    }


async def one_lane(
    mode: str,
    worker: Child,
    env: dict[str, str],
    state: FakeProviderState,
    answers: SubmitAnswers,
    stopping: threading.Event,
    config: Path,
) -> tuple[dict[str, Any], list[str]]:
    registry = load_destinations(config, env)
    client = await connect(env)
    outbox = OutboxClient(client, registry, WORKFLOW_TASK_QUEUE)
    engine = make_engine(env["DATABASE_URL"])
    per_appender = ITEMS_IN_LANE // APPENDERS
    expected = per_appender * APPENDERS
    progress = Progress(total=expected)
    ends = Ends(engine, expected, progress)
    began = time.monotonic()
    appending = asyncio.create_task(append_all(outbox, per_appender))
    results = asyncio.create_task(ends.wait(appending))
    # A run that gives up never reaches the kills' shares: wake the killer anyway.
    results.add_done_callback(lambda _: progress.changed.set())
    reporter = asyncio.create_task(report_progress(progress, state, began))
    try:
        kills = await kill_worker_at_random_moments(
            worker, env, progress, results, random.Random(SEED), stopping, began
        )
        final = await results
        append_s, lane_full = await appending
    finally:
        for task in (reporter, appending, results):
            task.cancel()
    elapsed = ends.at - began
    owner = lane_workflow_id(OUTBOX, LANE)
    if mode == "item":
        runs_name, runs = "lane_runs", await runs_of(client, owner)
    else:
        shard = shard_workflow_id(DESTINATION, shard_of(owner, SHARDS))
        runs_name, runs = "shard_runs", await runs_of(client, shard)
    lane = await asyncio.to_thread(get_lane, engine, OUTBOX, LANE)
    engine.dispose()
    arrivals = [
        (entry["payload"]["appender"], entry["payload"]["i"], entry["at"])
        for entry in state.delivery_log
        if entry["endpoint"] == DESTINATION
    ]
    findings = judge_arrivals(
        APPENDERS,
        per_appender,
        arrivals,
        submits_by_item(answers, per_appender),
        [kill.at for kill in kills],
    )
    problems = findings_problems(findings, expected)
    statuses = {status: sum(1 for s in final.values() if s == status) for status in FINAL_STATUSES}
    unfinished = expected - len(final)
    if unfinished:
        problems.append(
            f"{unfinished} items not ended in the read model (stalled {STALL_S:g}s at "
            f"{len(final)} of {expected})"
        )
    if statuses["failed"] or statuses["cancelled"]:
        problems.append(f"{statuses['failed']} failed, {statuses['cancelled']} cancelled")
    if mode == "item" and runs < 2:
        problems.append("the lane never continued as new")
    all_answers = [answer for found in answers.by_key.values() for answer in found]
    report = {
        **machine(),
        "run": "quick" if QUICK else "full",
        "delivery_mode": mode,
        "seed": SEED,
        "items": expected,
        "appenders": APPENDERS,
        **({"shards": SHARDS} if mode == "bulk" else {}),
        **({"lane_history_events": history_events(expected)} if mode == "item" else {}),
        "append_s": round(append_s, 1),
        "appends_per_s": round(expected / append_s, 1),
        "lane_full_refusals": lane_full,
        "elapsed_s": round(elapsed, 1),
        "delivered_per_s": round(findings.delivered / elapsed, 1) if elapsed > 0 else 0.0,
        "delivered": findings.delivered,
        "lost": findings.lost,
        "duplicates": findings.duplicates,
        "out_of_order": findings.out_of_order,
        "late_submits": findings.late_submits,
        "late_resubmits_after_kills": findings.late_resubmits_after_kills,
        "resubmits_deduped": findings.resubmits_deduped,
        "sent": statuses["sent"],
        "failed": statuses["failed"],
        "cancelled": statuses["cancelled"],
        "unfinished": unfinished,
        "lane_status": lane.status.value if lane is not None else None,
        runs_name: runs,
        "provider_submits": len(all_answers),
        "provider_503s": sum(1 for answer in all_answers if answer.status == 503),
        "worker_kills": len(kills),
        "kills": [_kill(kill) for kill in kills],
        "problems": problems,
    }
    return report, problems


def _kill(kill: Kill) -> dict[str, Any]:
    return {"after_s": kill.after_s, "items_ended": kill.items_final, "restart_s": kill.restart_s}


async def run_mode(mode: str) -> tuple[dict[str, Any], list[str]]:
    """A fresh stack for `mode` (its own data directory), the lane's run, the stack stopped (also
    on SIGTERM)."""
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    began = time.monotonic()
    data_dir = DATA_DIR / mode
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    config = data_dir / "destinations.toml"
    config.write_text(destinations_toml(mode, (ITEMS_IN_LANE // APPENDERS) * APPENDERS))
    env = {**os.environ, **PORTS}
    env.update(
        {
            "DEV_DATA_DIR": str(data_dir),
            "DATABASE_URL": f"sqlite:///{data_dir / 'readmodel.db'}",
            "OUTBOX_CONFIG": str(config),
            "WORKFLOW_TASK_QUEUE": WORKFLOW_TASK_QUEUE,
            # Plain payloads: this process's client and the worker must agree.
            "PAYLOAD_KEYS": "",
        }
    )
    children = [child for child in build_children(env) if child.name in ("temporal", "worker")]
    worker = next(child for child in children if child.name == "worker")
    state = FakeProviderState(
        DEFAULT_ACS_ACCESS_KEY,
        DEFAULT_WEBHOOK_SECRET,
        FaultConfig(error_rate=ERROR_RATE, seed=SEED),
    )
    answers = SubmitAnswers(create_app(state))
    stopping = threading.Event()
    async with serve_in_background(answers) as fake_url:
        env["FAKE_PROVIDER_URL"] = fake_url
        try:
            await start_in_thread(children, env, stopping)
            print(f"  stack up (fake provider in this process at {fake_url})", flush=True)
            report, problems = await one_lane(mode, worker, env, state, answers, stopping, config)
        finally:
            stopping.set()
            await asyncio.to_thread(stop, children)
    report["runtime_s"] = round(time.monotonic() - began, 1)
    return report, problems


def modes() -> list[str]:
    chosen = os.environ.get("LANE_MODE")
    if not chosen:
        return list(MODES)
    if chosen not in MODES:
        raise SystemExit(f"LANE_MODE must be one of {', '.join(MODES)}, not {chosen!r}")
    return [chosen]


def main() -> int:
    failed = False
    for mode in modes():
        print(
            f"lane scale ({mode} mode): {ITEMS_IN_LANE} items in one lane from {APPENDERS} "
            f"appenders, {ERROR_RATE:.0%} 503s, worker SIGKILLs, seed {SEED}",
            flush=True,
        )
        try:
            report, problems = asyncio.run(run_mode(mode))
        except StartupError as err:
            print(f"lane scale: {err} (see {LOG_DIR})", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("lane scale: interrupted; the stack is stopped", file=sys.stderr)
            return 130
        failed |= verdict(f"LANE SCALE ({mode} mode)", report, problems, result_path(mode)) != 0
        print(f"  worker and server logs in {LOG_DIR}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
