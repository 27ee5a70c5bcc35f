"""A worker process's start-up, before its workers run: the checks that refuse it (an open
production configuration, a destination it does not have, a read model newer than the code),
the databases its activities use, its Temporal client and the HTTP client toward providers.

A refusal exits with its reason in one line, no traceback (as the API's, `api/startup.py`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
from durable_outbox_temporal import connect
from durable_outbox_temporal.codec import EncryptionCodec, data_converter
from durable_outbox_temporal.connection import (
    missing_search_attributes,
    missing_search_attributes_message,
)
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.shards import count_changed, running_shards, shard_count_conflicts
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError

from activities.providers.network import provider_transport
from configuration.production import (
    InsecureConfiguration,
    open_payloads,
    public_credentials,
    refuse_open_production,
)
from configuration.settings import Settings
from configuration.version import VERSION
from readmodel import routes
from readmodel.db import (
    SchemaNewerThanCode,
    create_schema,
    make_engine,
    schema_not_at_head,
    verify_schema,
)
from readmodel.payload_store import claim_checks

log = logging.getLogger("outbox.worker")


def served_destinations(
    registry: DestinationRegistry, only_destinations: list[str] | None
) -> list[Destination]:
    """The destinations this process delivers to: `only_destinations` (`--destinations`), each
    of them configured, else all."""
    destinations = list(registry)
    if only_destinations is None:
        return destinations
    unknown = sorted(set(only_destinations) - set(registry.names))
    if unknown:
        raise SystemExit(f"unknown destinations: {', '.join(unknown)}")
    return [d for d in destinations if d.name in only_destinations]


def refuse_an_open_production(
    settings: Settings, codec: EncryptionCodec | None, destinations: Sequence[Destination]
) -> None:
    """As the API: a production worker does not start with plain payloads or a published
    credential for a destination it serves unless `ALLOW_INSECURE`; otherwise it says what is
    open."""
    reasons = open_payloads(codec) + public_credentials(destinations)
    try:
        refuse_open_production("worker", settings, reasons)
    except InsecureConfiguration as err:
        raise SystemExit(str(err)) from None
    for reason in reasons:
        log.warning("INSECURE: %s", reason)


async def refuse_a_changed_shard_count(
    client: Client, registry: DestinationRegistry, read_model: Engine
) -> None:
    """A bulk destination's `shards` changed while its shards still hold owners with no count
    recorded is refused: a lane with no route would have its new items routed by the new count,
    to another shard than its waiting ones, and an item from before items recorded their count
    its cancels and reports (`shards.shard_count_conflicts`). Every other owner keeps the count
    its route or its row names, so a change is otherwise taken. Where shards run and all agree
    with the configured count, the lanes they hold without a route (handed over by a release
    before routes) are given it now, so that a later change is taken. Visibility unavailable
    (it can be down while the rest of Temporal works) does not keep the worker from starting:
    it says the counts went unchecked."""

    try:
        conflicts = await shard_count_conflicts(
            client, registry, functools.partial(routes.unrouted_owners, read_model)
        )
        if conflicts:
            raise SystemExit("shards changed while shards run, refused: " + "; ".join(conflicts))
        for destination in registry:
            if not destination.is_bulk:
                continue
            running = await running_shards(client, destination.name)
            if count_changed(destination, running):
                log.info(
                    "destination %r: shards = %s now; owners keep the count their route names,"
                    " new ones take this one",
                    destination.name,
                    destination.shards,
                )
                continue
            if not running:
                # Nothing is held, or visibility does not show the shards yet (a moment after
                # their start): which count held lanes went by is not known, so none is given.
                continue
            given = await asyncio.to_thread(
                routes.route_held_lanes, read_model, destination.name, destination.shards
            )
            if given:
                log.info(
                    "destination %r: %s lanes holding items were given their route (shards = %s)",
                    destination.name,
                    given,
                    destination.shards,
                )
    except RPCError as err:
        log.warning("shard counts not checked at start-up: %s", err)


def refuse_bulk_without_claim_checks(settings: Settings, registry: DestinationRegistry) -> None:
    """A worker that runs workflows hosts the bulk shards of every destination in bulk mode. A
    shard carries the items it holds across continue-as-new in one payload, which Temporal
    refuses above 2 MB: without claim checks (which store it in the database) a shard holding a
    few thousand items (a provider down for a while) fails every workflow task from then on and
    delivers nothing. Measured: one shard holding 5,000 small items tried to carry 6.4 MB."""
    if settings.claim_check_bytes > 0:
        return
    bulk = sorted(destination.name for destination in registry if destination.mode == "bulk")
    if bulk:
        raise SystemExit(
            "CLAIM_CHECK_BYTES=0 refused: the bulk shards of "
            + ", ".join(bulk)
            + " carry their held items across continue-as-new in one payload, which Temporal"
            " refuses above 2 MB without claim checks (the shard then stops); keep claim checks"
            " on (CLAIM_CHECK_BYTES above 0, 65536 by default) or put these destinations in item"
            " mode"
        )


def open_read_model(settings: Settings, migrations: Sequence[Path]) -> Engine:
    """The read model of a worker that runs workflows, migrated to the code's schema (and the
    aggregate types' `migrations`); one migrated by a newer release refuses the start."""
    engine = make_engine(settings.database_url)
    try:
        create_schema(engine, migrations)
    except SchemaNewerThanCode as err:
        raise SystemExit(f"durable-outbox {VERSION} refuses to start: {err}") from None
    return engine


@dataclass(frozen=True)
class WorkerDatabases:
    """The databases of one worker process, all at `DATABASE_URL`, their columns of a caller's
    data sealed under the payload keys. `read_model`: only a worker that runs workflows has it.
    `storage`: where claim checks are read and written (none when they are off). `ledger`: where
    caps and quotas count, the attempt log is written, and the flow rules changed at run time
    are read from."""

    read_model: Engine | None
    storage: Engine | None
    ledger: Engine

    @classmethod
    def open(
        cls,
        settings: Settings,
        read_model: Engine | None,
        migrations: Sequence[Path],
        codec: EncryptionCodec | None,
    ) -> WorkerDatabases:
        """The process's databases, sharing `read_model`'s engine where it has one."""
        # An activities-only worker needs the database for claim checks too, to read a large
        # payload its submit carries.
        storage = read_model
        if storage is None and settings.claim_check_bytes > 0:
            storage = make_engine(settings.database_url)
        ledger = read_model or storage or make_engine(settings.database_url)
        if read_model is None:
            _refuse_a_newer_schema(ledger, migrations)
        for database in (read_model, storage, ledger):
            if database is not None:
                seal_with(database, None if codec is None else codec.value_keys())
        return cls(read_model, storage, ledger)


def _refuse_a_newer_schema(engine: Engine, migrations: Sequence[Path]) -> None:
    """An activities-only worker migrates nothing, but must not run on a schema it predates, and
    says (as `/readyz` does) when the schema is behind it."""
    try:
        verify_schema(engine, migrations)
        behind = schema_not_at_head(engine, migrations)
    except SchemaNewerThanCode as err:
        raise SystemExit(f"durable-outbox {VERSION} refuses to start: {err}") from None
    except DBAPIError as err:
        # As before: the database may come up after the worker; its activities retry.
        log.warning("read model unreachable at start-up (%s); continuing", type(err).__name__)
        return
    if behind:
        log.error("%s", behind)


def worker_runtime(metrics_address: str | None) -> Runtime | None:
    """The SDK runtime exporting Temporal's worker metrics (task latencies, slots, polls) for
    Prometheus at `metrics_address` `/metrics`; None: the default runtime, no export."""
    if not metrics_address:
        return None
    metrics = PrometheusConfig(bind_address=metrics_address)
    return Runtime(telemetry=TelemetryConfig(metrics=metrics))


async def connect_worker(
    settings: Settings,
    runtime: Runtime | None,
    codec: EncryptionCodec | None,
    storage: Engine | None,
) -> Client:
    """The process's Temporal client, its payloads through `codec` and claim checks in
    `storage`; a namespace without the search attributes is logged at once."""
    converter = data_converter(codec, claim_checks(storage, settings.claim_check_bytes))
    client = await connect(runtime=runtime, data_converter=converter)
    missing = await missing_search_attributes(client)
    if missing:
        # Every item's start would be refused: say why now, not at the first enqueue.
        log.error("%s", missing_search_attributes_message(missing))
    return client


async def open_provider_client(
    stack: AsyncExitStack, settings: Settings, tracing: bool
) -> httpx.AsyncClient:
    """The HTTP client every provider request of the process goes through, closed with `stack`."""
    connections = settings.provider_max_connections
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    transport = provider_transport(limits)
    http_client = await stack.enter_async_context(
        httpx.AsyncClient(limits=limits, transport=transport)
    )
    if tracing:
        # Provider requests as spans under their activity, with `traceparent` sent on.
        HTTPXClientInstrumentor.instrument_client(http_client)
    return http_client
