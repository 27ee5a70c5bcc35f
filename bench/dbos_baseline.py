"""The peer baseline: the bench's job (per item, a submit then a poll at the fake provider)
through DBOS Transact's queue, written as its docs write it.

Each configuration (system database on SQLite in WAL mode or on PostgreSQL; synchronous or
asynchronous workflows) runs in a process of its own, because DBOS keeps one global instance per
process. `make bench` starts them beside the product's stack and asks each for a round at a time
(`DbosBaselines.run`), alternating with the product's and the naive baseline's rounds.

The workflow does what `bench/naive.py` does: a submit step, a 50 ms durable sleep, a poll step
until the operation has succeeded, both steps through the product's own ACS email provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
from dbos import DBOS, DBOSConfig
from durable_outbox_temporal.contract.item import OperationStatus, PollRequest, SubmitRequest
from sqlalchemy.engine import make_url

from activities.providers.acs_email import AcsEmailProvider
from bench.naive import ACCESS_KEY, EMAIL
from configuration.providers import AcsEmailSettings

# The machine's PostgreSQL, where each run creates and drops its scratch system databases.
POSTGRES_URL = (
    make_url(
        os.environ.get(
            "READMODEL_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        )
    )
    .set(drivername="postgresql")
    .render_as_string(hide_password=False)
)
QUEUE = "bench"
# DBOS's queue and result-wait polling intervals default to 1 s, which would bound a round of a
# few seconds by its polling; its docs advise lowering them for latency. 50 ms is the naive
# baseline's sleep before its poll.
POLLING_INTERVAL_S = 0.05
# Workflows one process runs at once; the product's bench waits on its results 200 at a time.
WORKER_CONCURRENCY = 100
# Threads for synchronous workflows, and for waiting on their results.
SYNC_THREADS = 100
# The provider's connection pool, as the product's bench sets it (PROVIDER_MAX_CONNECTIONS).
PROVIDER_CONNECTIONS = 10
# A step that fails (a connection the loaded fake provider dropped) is tried again, as Temporal
# retries the naive baseline's activities (its default policy: 1 s, doubling) and the product
# its own: without retries one dropped connection failed a workflow and ended a full run's end
# to end scenario (2026-11-29).
STEP_RETRIES: dict[str, Any] = {
    "retries_allowed": True,
    "interval_seconds": 1.0,
    "backoff_rate": 2.0,
    "max_attempts": 10,
}

T = TypeVar("T")


@dataclass(frozen=True)
class Configuration:
    """One way to run DBOS: where its system database lives and how its workflows run."""

    name: str
    database: str  # "sqlite" or "postgres"
    asynchronous: bool


CONFIGURATIONS = (
    Configuration("sqlite-sync", "sqlite", asynchronous=False),
    Configuration("sqlite-async", "sqlite", asynchronous=True),
    Configuration("postgres-sync", "postgres", asynchronous=False),
    Configuration("postgres-async", "postgres", asynchronous=True),
)


class DbosBaselines:
    """One DBOS process per configuration, each on a scratch system database of its own
    (SQLite files under `data_dir`, PostgreSQL databases created and dropped here)."""

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str],
        configurations: tuple[Configuration, ...] = CONFIGURATIONS,
    ) -> None:
        self._data_dir = data_dir
        self._env = env
        self._configurations = configurations
        self._processes: dict[str, subprocess.Popen[str]] = {}
        self._databases: list[str] = []
        self._logs = contextlib.ExitStack()

    def __enter__(self) -> DbosBaselines:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        # Every process is launched before any is waited on: each spends seconds importing and
        # launching DBOS, and one after another they took 42 s on a loaded machine (2026-11-30).
        self._data_dir.mkdir(parents=True, exist_ok=True)
        for configuration in self._configurations:
            url = self._system_database(configuration)
            log = self._logs.enter_context((self._data_dir / f"{configuration.name}.log").open("w"))
            self._processes[configuration.name] = subprocess.Popen(
                [sys.executable, "-m", "bench.dbos_baseline", configuration.name, url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self._env,
                text=True,
            )
        for name, process in self._processes.items():
            assert process.stdout is not None
            ready = process.stdout.readline().strip()
            if ready != "ready":
                raise RuntimeError(f"DBOS {name} did not start (see its log)")
            # Stopped between its rounds: an idle DBOS process still polls its queue (measured:
            # four of them took 12-20 % of a core each while the product's rounds ran).
            process.send_signal(signal.SIGSTOP)

    def __exit__(self, *_: object) -> None:
        # Every process is told to end before any is waited on, so they end side by side.
        for process in self._processes.values():
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGCONT)
            with contextlib.suppress(OSError):
                assert process.stdin is not None
                process.stdin.close()
        for process in self._processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        with contextlib.suppress(psycopg.Error), _admin() as admin:
            for database in self._databases:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self._logs.close()

    @property
    def pids(self) -> dict[str, int]:
        """Each configuration's process id (its CPU is the baseline's worker CPU)."""
        return {name: process.pid for name, process in self._processes.items()}

    async def run(self, configuration: str, count: int) -> int:
        """One round: `count` items enqueued, then every result awaited; the items sent."""
        process = self._processes[configuration]
        assert process.stdin is not None and process.stdout is not None
        process.send_signal(signal.SIGCONT)
        try:
            process.stdin.write(f"{count}\n")
            process.stdin.flush()
            line = await asyncio.to_thread(process.stdout.readline)
        finally:
            process.send_signal(signal.SIGSTOP)
        if not line:
            raise RuntimeError(f"DBOS {configuration} ended (see its log)")
        sent: int = json.loads(line)["sent"]
        return sent

    def _system_database(self, configuration: Configuration) -> str:
        if configuration.database == "sqlite":
            path = self._data_dir / f"{configuration.name}.sqlite"
            path.unlink(missing_ok=True)
            # WAL is a property of the file: set once here, before DBOS opens it.
            with contextlib.closing(sqlite3.connect(path)) as connection:
                connection.execute("PRAGMA journal_mode=WAL")
            return f"sqlite:///{path}"
        database = f"dbos_bench_{configuration.name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        with _admin() as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        self._databases.append(database)
        return POSTGRES_URL.rsplit("/", 1)[0] + f"/{database}"


@contextlib.contextmanager
def _admin() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        yield connection


def serve(configuration: Configuration, system_database_url: str) -> None:
    """The child process: launch DBOS, then run a round per line of stdin (its item count),
    answering each with a JSON line."""
    if configuration.asynchronous:
        # Launched inside the running loop, DBOS runs the queue's coroutines on it: the
        # provider's connections stay on one loop (DBOS's docs for asynchronous apps).
        asyncio.run(_serve_async(system_database_url))
    else:
        _serve_sync(system_database_url)


def _launch(name: str, system_database_url: str) -> None:
    DBOS(
        config=DBOSConfig(
            name=f"bench-{name}",
            system_database_url=system_database_url,
            log_level="WARNING",
            notification_listener_polling_interval_sec=POLLING_INTERVAL_S,
            max_executor_threads=SYNC_THREADS,
        )
    )
    DBOS.launch()


def _provider(http: httpx.AsyncClient) -> AcsEmailProvider:
    settings = AcsEmailSettings(endpoint=os.environ["FAKE_PROVIDER_URL"], access_key=ACCESS_KEY)
    return AcsEmailProvider(settings, http)


def _request(run_id: str, n: int) -> SubmitRequest:
    # The first-sent time is the workflow's input, so a retried step repeats the same request
    # (the provider dedupes it) instead of sending anew, as the product's retries do.
    return SubmitRequest(
        "bench",
        f"dbos/{run_id}/{n}",
        f"{run_id}-dbos-{n}",
        EMAIL,
        1,
        first_submitted_at=datetime.now(UTC),
    )


async def _serve_async(system_database_url: str) -> None:
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=PROVIDER_CONNECTIONS))
    provider = _provider(http)

    @DBOS.step(**STEP_RETRIES)
    async def submit(request: SubmitRequest) -> str:
        return (await provider.submit(request)).operation_url or ""

    @DBOS.step(**STEP_RETRIES)
    async def poll(request: PollRequest) -> bool:
        return (await provider.poll(request)).status is OperationStatus.SUCCEEDED

    @DBOS.workflow()
    async def deliver(request: SubmitRequest) -> str:
        operation_url = await submit(request)
        while True:
            await DBOS.sleep_async(POLLING_INTERVAL_S)
            if await poll(PollRequest(request.destination, request.item_id, operation_url)):
                return "sent"

    _launch("async", system_database_url)
    queue = await DBOS.register_queue_async(
        QUEUE, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=POLLING_INTERVAL_S
    )
    print("ready", flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            run_id = uuid.uuid4().hex[:8]
            handles = await asyncio.gather(
                *(queue.enqueue_async(deliver, _request(run_id, n)) for n in range(int(line)))
            )
            outcomes = await asyncio.gather(
                *(h.get_result(polling_interval_sec=POLLING_INTERVAL_S) for h in handles)
            )
            print(json.dumps({"sent": outcomes.count("sent")}), flush=True)
    finally:
        await asyncio.to_thread(DBOS.destroy)
        await http.aclose()


def _serve_sync(system_database_url: str) -> None:
    # The provider is asynchronous: a synchronous step hands its call to one event loop thread.
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=PROVIDER_CONNECTIONS))
    provider = _provider(http)

    def on_loop(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    @DBOS.step(**STEP_RETRIES)
    def submit(request: SubmitRequest) -> str:
        return on_loop(lambda: provider.submit(request)).operation_url or ""

    @DBOS.step(**STEP_RETRIES)
    def poll(request: PollRequest) -> bool:
        return on_loop(lambda: provider.poll(request)).status is OperationStatus.SUCCEEDED

    @DBOS.workflow()
    def deliver(request: SubmitRequest) -> str:
        operation_url = submit(request)
        while True:
            DBOS.sleep(POLLING_INTERVAL_S)
            if poll(PollRequest(request.destination, request.item_id, operation_url)):
                return "sent"

    _launch("sync", system_database_url)
    queue = DBOS.register_queue(
        QUEUE, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=POLLING_INTERVAL_S
    )
    print("ready", flush=True)
    try:
        with ThreadPoolExecutor(SYNC_THREADS) as waiters:
            for line in sys.stdin:
                run_id = uuid.uuid4().hex[:8]
                handles = [queue.enqueue(deliver, _request(run_id, n)) for n in range(int(line))]
                outcomes = list(
                    waiters.map(
                        lambda h: h.get_result(polling_interval_sec=POLLING_INTERVAL_S), handles
                    )
                )
                print(json.dumps({"sent": outcomes.count("sent")}), flush=True)
    finally:
        DBOS.destroy()
        on_loop(http.aclose)


def by_name(name: str) -> Configuration:
    return next(c for c in CONFIGURATIONS if c.name == name)


if __name__ == "__main__":
    serve(by_name(sys.argv[1]), sys.argv[2])
