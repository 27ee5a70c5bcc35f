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


def get_resources(request: Request) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


def get_outbox_client(request: Request) -> OutboxClient:
    return get_resources(request).outbox


def get_item_service(request: Request) -> ItemService:
    return get_resources(request).items


def get_report_service(request: Request) -> DeliveryReportService:
    return get_resources(request).reports


def get_aggregate_service(request: Request) -> AggregateService:
    return get_resources(request).aggregates


def get_destination_controls(request: Request) -> DestinationControls:
    return get_resources(request).controls


def get_sealed_value_service(request: Request) -> SealedValueService:
    return get_resources(request).sealed


def get_engine(request: Request) -> Engine:
    return get_resources(request).engine


def get_destinations(request: Request) -> DestinationRegistry:
    return get_resources(request).destinations


def get_metrics(request: Request) -> ApiMetrics:
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


def get_caller(request: Request) -> Caller:
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
