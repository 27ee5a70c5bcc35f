"""What payload encryption costs per item: the AES-256-GCM codec (`durable_outbox_temporal.codec`)
run over
every payload in the histories of delivered items, as a client and worker with `PAYLOAD_KEYS`
would encode each once and decode it once.

The end-to-end figures run with plain payloads (the naive baseline has no codec); this adds the
codec's own CPU, measured on the very payloads those items carried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import Client

# Encode and decode each item's payloads this many times, so the timer sees milliseconds.
ROUNDS = 20


def payloads_in(message: Message) -> Iterator[Payload]:
    """Every `Payload` inside a history event (inputs, results, failures' details, headers)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.is_repeated:
            is_map = field.message_type.GetOptions().map_entry
            items = list(value.values()) if is_map else list(value)
        else:
            items = [value]
        for item in items:
            if isinstance(item, Payload):
                yield item
            elif isinstance(item, Message):
                yield from payloads_in(item)


async def codec_ms_per_item(client: Client, workflow_ids: list[str]) -> dict[str, float]:
    """CPU milliseconds the codec spends per item on its payloads (encode + decode), and the
    payload bytes per item it runs over."""
    payloads: list[Payload] = []
    for workflow_id in workflow_ids:
        handle = client.get_workflow_handle(workflow_id)
        async for event in handle.fetch_history_events():
            payloads.extend(payloads_in(event))
    codec = EncryptionCodec.from_setting(new_key_setting("bench"))
    started = time.process_time()
    for _ in range(ROUNDS):
        await codec.decode(await codec.encode(payloads))
    spent = time.process_time() - started
    count = len(workflow_ids)
    return {
        "codec_cpu_ms_per_item": round(spent * 1000 / ROUNDS / count, 3),
        "payload_bytes_per_item": round(sum(p.ByteSize() for p in payloads) / count),
    }
