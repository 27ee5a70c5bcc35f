"""A bulk shard: one of a bulk-mode destination's `shards` workflows (`bulk/{destination}/{n}`).

It holds the destination's items that hash to it, unordered ones and the ordering lanes whose
keys it owns (`durable_outbox_temporal.contract.bulk.owner_id`), and delivers them all with the
host's machinery (`workflows.host`). It ends once it has held nothing for `linger_s`; the next
enqueue starts it again.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.bulk import SHARD_WORKFLOW_TYPE, ShardInput

    from workflows.host import DeliveryHostWorkflow


@workflow.defn(name=SHARD_WORKFLOW_TYPE)
class BulkShardWorkflow(DeliveryHostWorkflow):
    """Holds a destination's items of one shard and delivers each with the shared machine."""

    @workflow.run
    async def run(self, start: ShardInput) -> None:
        await self._run()
