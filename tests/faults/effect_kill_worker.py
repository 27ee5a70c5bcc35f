"""`python -m tests.faults.effect_kill_worker`: the real worker (settings from the environment),
which SIGKILLs itself the moment an enqueue effect's activity has done its work and before the
worker can report it: the one point where an effect has happened and its ledger does not know.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from durable_outbox_temporal.contract.aggregate import EFFECT_ACTIVITY, EffectExecution
from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from configuration.settings import get_settings
from worker import run_worker


class KillAfterEnqueueEffect(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _KillAfter(next)


class _KillAfter(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await super().execute_activity(input)
        effect = input.args[0] if input.args else None
        if (
            activity.info().activity_type == EFFECT_ACTIVITY
            and isinstance(effect, EffectExecution)
            and effect.kind == "enqueue_item"
        ):
            logging.getLogger("outbox.faults").warning("killed after effect %s", effect.key)
            os.kill(os.getpid(), signal.SIGKILL)
        return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(run_worker(get_settings(), None, True, interceptors=[KillAfterEnqueueEffect()]))
