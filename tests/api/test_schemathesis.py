"""Schemathesis against the real app's OpenAPI schema: generated and mutated input never makes
the API answer with a server error."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.api.conftest import serve_stack
from tests.conftest import webhook_destination


async def test_no_server_errors_for_generated_input(
    dev_env, stack_factory, fake_provider, tmp_path: Path
) -> None:
    # The dev server: every route works on it (task-queue configuration, which the destination
    # routes read and write, is not implemented by the time-skipping server).
    stack = await stack_factory(webhook_destination(fake_provider), env=dev_env)
    async with serve_stack(stack) as url:
        report, returncode = await _schemathesis(url, tmp_path)

    assert returncode == 0, report[-4000:]
    assert "passed" in report and "Server error" not in report


async def _schemathesis(url: str, tmp_path: Path) -> tuple[str, int | None]:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    # A subprocess, so this event loop stays free to serve the requests it sends.
    process = await asyncio.create_subprocess_exec(
        str(schemathesis),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "25",
        "--generation-deterministic",
        "--request-timeout",
        "20",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    return output.decode(errors="replace"), process.returncode
