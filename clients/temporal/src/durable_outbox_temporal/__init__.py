"""The Python client other services use to talk to durable-outbox directly through Temporal.

    from durable_outbox_temporal import OutboxClient, connect
    from durable_outbox_temporal.destinations import DestinationRegistry

    destinations = DestinationRegistry.from_file(path, provider_settings=None)
    client = OutboxClient(await connect(), destinations)
    result = await client.enqueue("billing", "fake-email", payload, key="invoice-42")

`connect()` reads the standard Temporal settings (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`,
`TEMPORAL_API_KEY`, `TEMPORAL_TLS_*`, a profile file); see `durable_outbox_temporal.connection`.
"""

from durable_outbox_temporal.client import OutboxClient
from durable_outbox_temporal.codec import PayloadKeyMissing
from durable_outbox_temporal.connection import TemporalConnection, connect, load_connect_config
from durable_outbox_temporal.contract.item import ItemStatus, NewItem, OutboxItemView
from durable_outbox_temporal.errors import (
    CannotCancel,
    CommandConflict,
    EffectNotFailed,
    IdempotencyConflict,
    InvalidCommand,
    InvalidRequest,
    ItemErased,
    ItemFailedUseRedrive,
    ItemNotFound,
    LaneFull,
    LaneNotFound,
    LaneNotHalted,
    NotErasable,
    NotRedrivable,
    OutboxError,
    PayloadPruned,
    PayloadTooLarge,
    TemporalUnavailable,
    UnknownAggregate,
    UnknownCommand,
    UnknownDestination,
    UnknownEffect,
    is_temporal_unavailable,
)
from durable_outbox_temporal.placement import CancelRequested, EnqueueResult
from durable_outbox_temporal.validation import validate_key, validate_ordering_key, validate_outbox

__all__ = [
    "CancelRequested",
    "CannotCancel",
    "CommandConflict",
    "EffectNotFailed",
    "InvalidCommand",
    "UnknownAggregate",
    "UnknownCommand",
    "EnqueueResult",
    "IdempotencyConflict",
    "InvalidRequest",
    "ItemFailedUseRedrive",
    "ItemNotFound",
    "ItemStatus",
    "LaneFull",
    "LaneNotFound",
    "LaneNotHalted",
    "NewItem",
    "ItemErased",
    "PayloadPruned",
    "NotErasable",
    "NotRedrivable",
    "OutboxClient",
    "OutboxError",
    "OutboxItemView",
    "PayloadKeyMissing",
    "PayloadTooLarge",
    "TemporalConnection",
    "TemporalUnavailable",
    "UnknownDestination",
    "UnknownEffect",
    "connect",
    "is_temporal_unavailable",
    "load_connect_config",
    "validate_key",
    "validate_ordering_key",
    "validate_outbox",
]
