"""Schemathesis against the real app's OpenAPI schema: generated and mutated input never makes
the API answer with a server error."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.api.conftest import ServedApi


async def test_no_server_errors_for_generated_input(served_api_factory, tmp_path: Path) -> None:
    api: ServedApi = await served_api_factory()
    schemathesis = Path(sys.executable).parent / "schemathesis"
    # A subprocess, so this event loop stays free to serve the requests it sends.
    process = await asyncio.create_subprocess_exec(
        str(schemathesis),
        "run",
        f"{api.url}/openapi.json",
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
    report = output.decode(errors="replace")

    assert process.returncode == 0, report[-4000:]
    assert "passed" in report and "Server error" not in report
