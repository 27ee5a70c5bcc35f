"""Custom search attributes the Temporal Web UI and list queries filter on."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

OUTBOX_NAME = SearchAttributeKey.for_keyword("OutboxName")
OUTBOX_STATUS = SearchAttributeKey.for_keyword("OutboxStatus")
DESTINATION = SearchAttributeKey.for_keyword("Destination")
ORDERING_KEY = SearchAttributeKey.for_keyword("OrderingKey")
AGGREGATE_TYPE = SearchAttributeKey.for_keyword("AggregateType")
# An ordering lane's status: running, idle or halted (`LaneStatus`).
LANE_STATE = SearchAttributeKey.for_keyword("LaneState")

ALL = (OUTBOX_NAME, OUTBOX_STATUS, DESTINATION, ORDERING_KEY, AGGREGATE_TYPE, LANE_STATE)


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Keyword` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}=Keyword"]
    return flags


def item_start_attributes(
    outbox: str, destination: str, status: str, ordering_key: str | None
) -> TypedSearchAttributes:
    """What an item workflow starts with, whoever starts it (the client, or its lane)."""
    pairs = [
        SearchAttributePair(OUTBOX_NAME, outbox),
        SearchAttributePair(OUTBOX_STATUS, status),
        SearchAttributePair(DESTINATION, destination),
    ]
    if ordering_key is not None:
        pairs.append(SearchAttributePair(ORDERING_KEY, ordering_key))
    return TypedSearchAttributes(pairs)
