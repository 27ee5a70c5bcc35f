"""The FastAPI app factory: `uvicorn api.main:create_app --factory`.

The lifespan owns the long-lived resources: the Temporal client and the `OutboxClient` over it,
the destinations, the read-model engine (schema created at start-up) and the live-event hub.
Tests inject their own client and engine so the real app runs against a test server.

With `OUTBOX_ENV=production` (the image's default) the lifespan refuses an open configuration
(no token, no payload keys, a published credential) unless `ALLOW_INSECURE` is set
(`api/security.py`, `configuration/production.py`). Every log line has its `token=` and
`secret=` values replaced with `***` (`configuration/redaction.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta

from durable_outbox_temporal import OutboxClient, TemporalConnection
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.codec import codec_from_environment, data_converter
from durable_outbox_temporal.connection import (
    missing_search_attributes,
    missing_search_attributes_message,
)
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.destinations import DestinationRegistry
from durable_outbox_temporal.shards import shard_count_conflicts
from durable_outbox_temporal.tracing import configure_tracing
from fastapi import APIRouter, Depends, FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from starlette.routing import BaseRoute
from temporalio.client import Client

from api.auth import CODEC_PATH, load_tokens, require_json, require_token
from api.codec_work import CodecWorkers
from api.deps import Resources
from api.errors import install_error_handlers
from api.limits import BodySizeLimit
from api.live import LiveHub, SocketLimits
from api.metrics import ApiMetrics, MetricsMiddleware
from api.outbox_labels import OutboxLabels
from api.routes import (
    activity,
    aggregates,
    attempts,
    dashboard,
    dead_letters,
    docs,
    erasure,
    events,
    health,
    items,
    lanes,
    live,
    outboxes,
    problems,
    projectors,
    replays,
    schedules,
    sealed_values,
)
from api.routes import codec as codec_route
from api.routes import destinations as destination_routes
from api.routes import token as token_route
from api.security import AllowedHosts, CodecCors, SecurityHeaders, check_configuration
from api.startup import PlainStartupRefusal, StartupRefused
from configuration.destinations import load_destinations
from configuration.gc_pauses import freeze_startup_heap
from configuration.redaction import install_log_redaction
from configuration.settings import Settings, get_settings
from configuration.version import VERSION
from readmodel.db import SchemaNewerThanCode, create_schema, make_engine, schema_not_at_head
from readmodel.payload_store import claim_checks
from readmodel.routes import ReadModelRoutes, unrouted_owners
from service.aggregate_types import AggregateTypes, load_aggregate_types
from service.aggregates import AggregateService
from service.destinations import DestinationControls
from service.items import ItemService
from service.reports import DeliveryReportService
from service.sealed_values import SealedValueService

log = logging.getLogger("outbox.api")


def create_app(
    settings: Settings | None = None,
    *,
    temporal_client: Client | TemporalConnection | None = None,
    outbox_client: OutboxClient | None = None,
    destinations: DestinationRegistry | None = None,
    engine: Engine | None = None,
) -> FastAPI:
    """Build the app; anything not injected is created from `settings` at start-up."""
    settings = settings or get_settings()
    _configure_logging()
    app = FastAPI(
        title="durable-outbox",
        version=VERSION,
        summary="Durable, observable, rate-limited side effects on Temporal",
        description=(
            "Errors are RFC 9457 `application/problem+json`. Request bodies are limited to"
            f" {settings.max_request_bytes} bytes (`MAX_REQUEST_BYTES`; 413 above). With"
            " `API_TOKEN` or `API_TOKENS_FILE` set, `/v1` needs `Authorization: Bearer <token>`"
            " with the route's scope (`read`, `enqueue` or `operate`); `GET /v1/token` tells a"
            " token what it may do."
        ),
        lifespan=lifespan(
            settings,
            temporal_client=temporal_client,
            outbox_client=outbox_client,
            destinations=destinations,
            engine=engine,
        ),
        # Served by `api.routes.docs` from packaged files: FastAPI's own pages load a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.metrics = ApiMetrics(
        backlog_cache_s=settings.backlog_metrics_cache_s,
        backlog_timeout_s=settings.backlog_metrics_timeout_s,
        token_required=settings.metrics_token_required,
        outbox_labels=OutboxLabels(settings.metrics_outboxes_list, settings.metrics_outbox_labels),
    )
    install_error_handlers(app)
    if configure_tracing("durable-outbox-api"):
        # Each request a span; the Temporal client's start joins it (its interceptor).
        FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")
    _read_request_state(app, settings)
    include_routers(app)
    _add_middleware(app, settings)
    return app


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        # Under plain uvicorn nothing configures our loggers, and the start-up line saying
        # whether auth is on must be seen; a logging config set up beforehand wins.
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    install_log_redaction()


def lifespan(
    settings: Settings,
    *,
    temporal_client: Client | TemporalConnection | None = None,
    outbox_client: OutboxClient | None = None,
    destinations: DestinationRegistry | None = None,
    engine: Engine | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: it opens the read-model engine and the Temporal client (unless
    injected), puts the services over them in `app.state.resources`, and closes what it opened."""

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        if destinations is not None:
            registry = destinations
        elif outbox_client is not None:
            registry = outbox_client.destinations
        else:
            registry = load_destinations(settings.outbox_config)
        check_configuration(app, settings, registry)
        db = engine if engine is not None else make_engine(settings.database_url)
        # The read model's columns of a caller's data are sealed under the payload keys.
        codec = app.state.codec
        seal_with(db, None if codec is None else codec.value_keys())
        # An entry of AGGREGATE_TYPES that does not load stops the start-up, naming it.
        aggregate_types = load_aggregate_types(settings.aggregate_types)
        _create_schema(db, aggregate_types)
        if outbox_client is None:
            outbox = _connect(settings, db, registry, temporal_client)
        else:
            outbox = outbox_client
        app.state.resources = _services(settings, outbox, registry, db, aggregate_types)
        app.state.live = LiveHub(
            db, SocketLimits(settings.live_sockets_max, settings.live_sockets_per_token)
        )
        app.state.metrics.backlog.attach(db)
        app.state.metrics.destinations.attach(app.state.resources.controls)
        # In the background: the API starts (and /readyz answers) while Temporal is down.
        search_attributes = asyncio.create_task(_log_namespace_problems(app, outbox, db))
        freeze_startup_heap()
        try:
            yield
        finally:
            search_attributes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await search_attributes
            await app.state.metrics.backlog.detach()
            await app.state.metrics.destinations.detach()
            await app.state.live.close()
            app.state.codec_workers.close()
            if engine is None:
                db.dispose()

    return run


def _create_schema(db: Engine, aggregate_types: AggregateTypes) -> None:
    try:
        create_schema(db, aggregate_types.migrations)
    except DBAPIError as err:
        # Start anyway: /readyz reports the database, and the worker creates the schema too.
        log.error("read model not migrated at start-up (%s); continuing", type(err).__name__)
        # A database that answers but would not migrate (no DDL rights): what /readyz says.
        with contextlib.suppress(DBAPIError):
            behind = schema_not_at_head(db, aggregate_types.migrations)
            if behind:
                log.error("%s", behind)
    except SchemaNewerThanCode as err:
        raise StartupRefused(f"durable-outbox {VERSION} refuses to start: {err}") from None


async def _log_namespace_problems(app: FastAPI, outbox: OutboxClient, db: Engine) -> None:
    """Say at start, as the worker does and as `/readyz` answers, that the namespace lacks the
    search attributes every item's start needs; and, as the worker refuses, that a bulk
    destination's `shards` differs from the count its running shards were started under."""
    try:
        missing = await missing_search_attributes(await outbox.temporal())
    except Exception as err:  # Temporal down: /readyz says so
        log.warning("search attributes not checked at start-up: %s: %s", type(err).__name__, err)
        return
    if missing:
        log.error("%s", missing_search_attributes_message(missing))
    else:
        app.state.search_attributes_registered = True

    # As the worker refuses to start (it is the one restarted with a changed destinations file,
    # and the one that keeps shards going): an owner without a route goes by the configured
    # count here as well.
    try:
        conflicts = await shard_count_conflicts(
            await outbox.temporal(), outbox.destinations, functools.partial(unrouted_owners, db)
        )
    except Exception as err:  # Temporal down: /readyz says so
        log.warning("shard counts not checked at start-up: %s: %s", type(err).__name__, err)
        return
    for conflict in conflicts:
        log.error("%s", conflict)


def _connect(
    settings: Settings,
    db: Engine,
    registry: DestinationRegistry,
    temporal_client: Client | TemporalConnection | None,
) -> OutboxClient:
    """The `OutboxClient` over `temporal_client`, or over a connection of its own."""
    # Connects on first use: the API starts (and /readyz says why it is not ready) while
    # Temporal is down.
    converter = data_converter(
        codec_from_environment(), claim_checks(db, settings.claim_check_bytes)
    )
    client = temporal_client or TemporalConnection(data_converter=converter)
    return OutboxClient(client, registry, settings.workflow_task_queue, routes=ReadModelRoutes(db))


def _services(
    settings: Settings,
    outbox: OutboxClient,
    registry: DestinationRegistry,
    db: Engine,
    aggregate_types: AggregateTypes,
) -> Resources:
    """The services every request shares, over the lifespan's clients and engine."""
    return Resources(
        settings=settings,
        outbox=outbox,
        destinations=registry,
        engine=db,
        items=ItemService(outbox, db, cancel_wait=timedelta(seconds=settings.cancel_wait_s)),
        reports=DeliveryReportService(outbox, db),
        aggregates=AggregateService(
            AggregateClient(
                outbox.connection,
                outbox.task_queue,
                definitions=aggregate_types.definitions,
                operations_task_queue=settings.operations_task_queue,
            ),
            db,
            aggregate_types.projectors.values(),
        ),
        controls=DestinationControls(outbox, registry, db),
        aggregate_types=aggregate_types,
        sealed=SealedValueService(outbox, db, aggregate_types.sealed_tables),
    )


def _read_request_state(app: FastAPI, settings: Settings) -> None:
    """What requests read from `app.state` besides the lifespan's resources."""
    # Read once at start: a malformed API_TOKENS_FILE stops the API here, naming the problem.
    app.state.tokens = load_tokens(settings)
    # The Web UI's codec server decrypts with the same keys the clients encrypt with.
    app.state.codec = codec_from_environment()
    app.state.codec_max_payloads = settings.codec_max_payloads
    app.state.codec_workers = CodecWorkers(app.state.codec, settings.codec_processes)
    # Signs the codec session cookies: shared by the API processes behind one host if set.
    app.state.session_key = (
        settings.session_secret.encode() if settings.session_secret else secrets.token_bytes(32)
    )
    app.state.insecure = []
    app.state.public_base_url = settings.public_base_url.rstrip("/")


def include_routers(app: FastAPI) -> None:
    """The app's routes (`_routes`), then its static files."""
    app.router.routes.extend(_routes())
    app.mount(docs.ASSETS_PATH, docs.assets(), name="docs-assets")
    app.mount(dashboard.STATIC_PATH, dashboard.assets(), name="static")


@functools.cache
def _routes() -> tuple[BaseRoute, ...]:
    """`/v1` behind the bearer token, then the routes that check their own: built once per
    process and shared by its apps. FastAPI prepares an included route (its dependencies and
    response model) lazily, per app, at the first request that reaches it; a process serves one
    app, but the test suite builds hundreds, each of which prepared them all again
    (docs/decisions/parallel-tests.md). Nothing in a route belongs to an app: handlers reach the
    app's state through the request, and FastAPI's `app.dependency_overrides`, which the shared
    routes do not consult, is not used."""
    router = APIRouter()
    authenticated = [Depends(require_token), Depends(require_json)]
    router.include_router(token_route.router, dependencies=authenticated)
    router.include_router(codec_route.router, dependencies=authenticated)
    router.include_router(items.router, dependencies=authenticated)
    router.include_router(attempts.router, dependencies=authenticated)
    router.include_router(erasure.router, dependencies=authenticated)
    router.include_router(outboxes.router, dependencies=authenticated)
    router.include_router(lanes.router, dependencies=authenticated)
    router.include_router(dead_letters.router, dependencies=authenticated)
    router.include_router(replays.router, dependencies=authenticated)
    router.include_router(aggregates.router, dependencies=authenticated)
    router.include_router(destination_routes.router, dependencies=authenticated)
    router.include_router(activity.router, dependencies=authenticated)
    router.include_router(schedules.router, dependencies=authenticated)
    router.include_router(projectors.router, dependencies=authenticated)
    router.include_router(sealed_values.router, dependencies=authenticated)
    router.include_router(live.router)  # checks its own token: browsers cannot send headers
    router.include_router(events.router)  # per-destination secrets: Event Grid sends no bearer
    router.include_router(health.router)
    router.include_router(dashboard.router)
    router.include_router(docs.router)
    router.include_router(problems.router)  # open: each problem's `type` links here
    return tuple(router.routes)


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    # The middleware added last runs first: metrics wrap the size limit and count its 413s.
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        path_limits={CODEC_PATH: (settings.codec_max_request_bytes, "CODEC_MAX_REQUEST_BYTES")},
    )
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    # The Web UI calls the codec server from the browser, from its own origin.
    app.add_middleware(CodecCors, origins=settings.codec_cors_origins_list)
    # Every answer says how a browser may use it: own scripts only, never in a frame.
    app.add_middleware(SecurityHeaders)
    # Outermost: a request for another host name (DNS rebinding) is refused before anything.
    app.add_middleware(AllowedHosts, allowed_hosts=settings.allowed_hosts_list)
    # The lifespan only: a start-up refused on purpose logs its reason, not a traceback.
    app.add_middleware(PlainStartupRefusal)
