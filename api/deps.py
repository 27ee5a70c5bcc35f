"""Request dependencies: the resources the app's lifespan owns, as `Annotated` aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.aggregate_definition import RESERVED_ACTORS
from durable_outbox_temporal.destinations import DestinationRegistry
from fastapi import Depends, Request
from sqlalchemy import Engine

from api.auth import ANY_ACTOR, ApiToken
from api.metrics import ApiMetrics
from configuration.settings import Settings
from service.aggregate_types import AggregateTypes
from service.aggregates import AggregateService
from service.destinations import DestinationControls
from service.items import ItemService
from service.reports import DeliveryReportService
from service.sealed_values import SealedValueService


@dataclass
class Resources:
    """Everything the lifespan opens once and every request shares."""

    settings: Settings
    outbox: OutboxClient
    destinations: DestinationRegistry
    engine: Engine
    items: ItemService
    reports: DeliveryReportService
    aggregates: AggregateService
    controls: DestinationControls
    # The aggregate types served (`AGGREGATE_TYPES`), with their projectors.
    aggregate_types: AggregateTypes
    sealed: SealedValueService


def resources_of(request: Request) -> Resources:
    """The resources the lifespan opened, for code holding the request."""
    resources: Resources = request.app.state.resources
    return resources


# The dependencies are `async def`: FastAPI runs a plain `def` dependency in its thread pool,
# a thread hand-off per dependency and request for what is an attribute read.
# Why: docs/decisions/async-dependencies.md


async def get_resources(request: Request) -> Resources:
    return resources_of(request)


async def get_outbox_client(request: Request) -> OutboxClient:
    return resources_of(request).outbox


async def get_item_service(request: Request) -> ItemService:
    return resources_of(request).items


async def get_report_service(request: Request) -> DeliveryReportService:
    return resources_of(request).reports


async def get_aggregate_service(request: Request) -> AggregateService:
    return resources_of(request).aggregates


async def get_destination_controls(request: Request) -> DestinationControls:
    return resources_of(request).controls


async def get_sealed_value_service(request: Request) -> SealedValueService:
    return resources_of(request).sealed


async def get_engine(request: Request) -> Engine:
    return resources_of(request).engine


async def get_destinations(request: Request) -> DestinationRegistry:
    return resources_of(request).destinations


async def get_metrics(request: Request) -> ApiMetrics:
    metrics: ApiMetrics = request.app.state.metrics
    return metrics


@dataclass(frozen=True)
class Caller:
    """Who calls: the token's name (the principal) and the actors it may act as."""

    principal: str | None
    # None: any actor but the reserved ones.
    actors: frozenset[str] | None

    def may_act_as(self, actor: str) -> bool:
        """Never a reserved actor (the service's own); otherwise one the token allows."""
        return actor not in RESERVED_ACTORS and (self.actors is None or actor in self.actors)


async def get_caller(request: Request) -> Caller:
    """The caller `require_token` authenticated. A tokens-file token acts as its own name, or
    as the `actors` its entry lists (`["*"]`: anyone); an `API_TOKEN` token as anyone;
    with no token configured nobody is authenticated, so any actor but the reserved may be
    named (development only: docs/explanation/aggregates.md#actors-and-secrets)."""
    token: ApiToken | None = getattr(request.state, "token", None)
    if token is None:
        tokens_configured = bool(request.app.state.tokens)
        return Caller(principal=None, actors=frozenset() if tokens_configured else None)
    if token.actors is None:
        return Caller(principal=token.name, actors=frozenset({token.name}))
    if ANY_ACTOR in token.actors:
        return Caller(principal=token.name, actors=None)
    return Caller(principal=token.name, actors=token.actors)


ResourcesDep = Annotated[Resources, Depends(get_resources)]
OutboxClientDep = Annotated[OutboxClient, Depends(get_outbox_client)]
ItemServiceDep = Annotated[ItemService, Depends(get_item_service)]
ReportServiceDep = Annotated[DeliveryReportService, Depends(get_report_service)]
AggregateServiceDep = Annotated[AggregateService, Depends(get_aggregate_service)]
DestinationControlsDep = Annotated[DestinationControls, Depends(get_destination_controls)]
SealedValueServiceDep = Annotated[SealedValueService, Depends(get_sealed_value_service)]
EngineDep = Annotated[Engine, Depends(get_engine)]
DestinationsDep = Annotated[DestinationRegistry, Depends(get_destinations)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
CallerDep = Annotated[Caller, Depends(get_caller)]
