"""Custom search attributes the Temporal Web UI and list queries filter on."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

OUTBOX_NAME = SearchAttributeKey.for_keyword("OutboxName")
OUTBOX_STATUS = SearchAttributeKey.for_keyword("OutboxStatus")
DESTINATION = SearchAttributeKey.for_keyword("Destination")
ORDERING_KEY = SearchAttributeKey.for_keyword("OrderingKey")
AGGREGATE_TYPE = SearchAttributeKey.for_keyword("AggregateType")

ALL = (OUTBOX_NAME, OUTBOX_STATUS, DESTINATION, ORDERING_KEY, AGGREGATE_TYPE)


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Keyword` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}=Keyword"]
    return flags
