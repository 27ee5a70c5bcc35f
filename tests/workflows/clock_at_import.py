"""A workflow module that reads the clock when imported: the sandbox's check refuses it
(`tests/workflows/test_sandbox.py`)."""

from __future__ import annotations

import datetime

from temporalio import workflow

IMPORTED_AT = datetime.datetime.now()


@workflow.defn(sandboxed=True)
class ReadsTheClockAtImport:
    @workflow.run
    async def run(self) -> str:
        return IMPORTED_AT.isoformat()
