"""Request dependencies: the resources the app's lifespan owns, as `Annotated` aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from api.metrics import ApiMetrics
from common.destinations import DestinationRegistry
from common.settings import Settings
from outbox_client import OutboxClient
from service.aggregates import AggregateService
from service.destinations import DestinationControls
from service.items import ItemService
from service.reports import DeliveryReportService


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


def get_engine(request: Request) -> Engine:
    return get_resources(request).engine


def get_destinations(request: Request) -> DestinationRegistry:
    return get_resources(request).destinations


def get_metrics(request: Request) -> ApiMetrics:
    metrics: ApiMetrics = request.app.state.metrics
    return metrics


ResourcesDep = Annotated[Resources, Depends(get_resources)]
OutboxClientDep = Annotated[OutboxClient, Depends(get_outbox_client)]
ItemServiceDep = Annotated[ItemService, Depends(get_item_service)]
ReportServiceDep = Annotated[DeliveryReportService, Depends(get_report_service)]
AggregateServiceDep = Annotated[AggregateService, Depends(get_aggregate_service)]
DestinationControlsDep = Annotated[DestinationControls, Depends(get_destination_controls)]
EngineDep = Annotated[Engine, Depends(get_engine)]
DestinationsDep = Annotated[DestinationRegistry, Depends(get_destinations)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
