"""The Python client other services use to talk to durable-outbox directly through Temporal.

    from outbox_client import OutboxClient, connect
    from common.destinations import DestinationRegistry

    destinations = DestinationRegistry.from_file(path, provider_settings=None)
    client = OutboxClient(await connect(), destinations)
    result = await client.enqueue("billing", "fake-email", payload, key="invoice-42")

`connect()` reads the standard Temporal settings (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`,
`TEMPORAL_API_KEY`, `TEMPORAL_TLS_*`, a profile file); see `outbox_client.connection`.
"""

from common.codec import PayloadKeyMissing
from contract.item import ItemStatus, OutboxItemView
from outbox_client.client import OutboxClient
from outbox_client.connection import TemporalConnection, connect, load_connect_config
from outbox_client.errors import (
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
    TemporalUnavailable,
    UnknownAggregate,
    UnknownCommand,
    UnknownDestination,
    UnknownEffect,
    is_temporal_unavailable,
)
from outbox_client.placement import CancelRequested, EnqueueResult
from outbox_client.validation import validate_key, validate_ordering_key, validate_outbox

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
    "ItemErased",
    "NotErasable",
    "NotRedrivable",
    "OutboxClient",
    "OutboxError",
    "OutboxItemView",
    "PayloadKeyMissing",
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
