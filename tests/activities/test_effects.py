"""The effect executor's activity: an effect executed twice (a retried activity) has one
effect, here an enqueue that returns the same item."""

from __future__ import annotations

from durable_outbox_temporal.contract.aggregate import EffectExecution
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key

from activities.effects import EffectActivities
from tests.conftest import email_destination, unique_name
from tests.workflows.test_effects import aggregates_on


async def test_a_retried_enqueue_effect_returns_the_same_item(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    executor = EffectActivities(stack.outbox, aggregates_on(stack))
    key = f"labour:{unique_name('l')}:9:notify.s1.email"
    execution = EffectExecution(
        "labour",
        "l",
        key,
        "enqueue_item",
        {
            "outbox": "tests",
            "destination": destination.name,
            "payload": {
                "senderAddress": "a@example.com",
                "recipients": {"to": [{"address": "b@example.com"}]},
                "content": {"subject": "Hello", "plainText": "Hi"},
            },
            "ordering_key": None,
        },
    )

    first = await executor.execute_effect(execution)
    second = await executor.execute_effect(execution)

    item_id = item_workflow_id("tests", key)
    assert first == {"item_id": item_id, "created": True}
    assert second == {"item_id": item_id, "created": False}
    assert (await stack.result(item_id)).status == "sent"
    stats = await fake_provider.admin.key_stats(provider_idempotency_key(item_id))
    assert stats["deliveries"] == 1
