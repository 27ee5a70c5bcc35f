"""The operator's tools against `make dev` on ports that are not the defaults, as a user runs
them: the `outbox` command in a shell, the REST client, `OutboxClient` with the stack's payload
keys, the dashboard and the Temporal Web UI (whose codec calls must pass CORS from its port)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pytest
import pytest_asyncio
from durable_outbox_rest import AsyncOutboxRest
from durable_outbox_temporal import OutboxClient, connect
from durable_outbox_temporal.codec import PayloadKeyMissing
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.destinations import DestinationRegistry
from playwright.async_api import Browser, expect

from tests.browser.conftest import ARTIFACTS
from tests.devstack.stack import ROOT, DevStack

T = TypeVar("T")


@pytest_asyncio.fixture(loop_scope="session")
async def dev_stack(tmp_path: Path) -> AsyncIterator[DevStack]:
    stack = DevStack(tmp_path / "data")
    await asyncio.to_thread(stack.start)
    try:
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


def outbox_command(stack: DevStack, *argv: str) -> subprocess.CompletedProcess[str]:
    """`outbox ...` in a shell whose OUTBOX_API_URL points at the stack."""
    env = {k: v for k, v in os.environ.items() if k != "API_TOKEN"}
    env["OUTBOX_API_URL"] = stack.api
    return subprocess.run(
        [str(Path(sys.executable).parent / "outbox"), *argv],  # the installed command
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Task[T]:
    """`function` started in a thread, as a task to await later."""
    return asyncio.create_task(asyncio.to_thread(function, *args, **kwargs))


@pytest.mark.timeout(300)
async def test_cli_rest_client_outbox_client_dashboard_and_web_ui_on_other_ports(
    dev_stack: DevStack, browser: Browser
) -> None:
    stack = dev_stack
    # The API starts its codec's worker process on the first codec call (a second or so): one
    # call with nothing to decode starts it now, before the Web UI asks.
    warming = await in_thread(
        httpx.post, f"{stack.api}/codec/decode", json={"payloads": []}, timeout=60
    )
    # Each `outbox` command is a process of its own (a second or so to start), and the Web UI a
    # few hundred scripts to load: each runs beside the checks that do not depend on it.
    enqueuing = await in_thread(
        outbox_command,
        stack,
        *("enqueue", "ops", "--destination", "fake-webhook", "--key", "via-cli"),
        *("--payload", json.dumps({"via": "the command line"})),
    )

    async def web_ui() -> None:
        # The Web UI on its own port decrypts through the API's codec (CORS from that origin).
        assert (await warming).status_code == 200
        page = await browser.new_page()
        ui = f"http://127.0.0.1:{stack.ports['DEV_UI_PORT']}"
        workflow = quote(item_workflow_id("ops", "via-cli"), safe="")
        await page.goto(f"{ui}/namespaces/default/workflows/{workflow}")
        try:
            await expect(page.locator("body")).to_contain_text("the command line", timeout=30_000)
        finally:
            await page.screenshot(path=str(ARTIFACTS / "make-dev-web-ui.png"), full_page=True)

    async with AsyncOutboxRest(stack.api) as rest:
        await rest.enqueue("ops", "fake-webhook", {"via": "rest"}, idempotency_key="via-rest")

    # The stack encrypts payloads; a client with its keys writes and reads them as it does.
    keys = Path(stack.env["DEV_DATA_DIR"]) / "payload-keys"
    client = await connect({"TEMPORAL_ADDRESS": stack.temporal, "PAYLOAD_KEYS_FILE": str(keys)})
    destinations = DestinationRegistry.from_file(
        ROOT / "config" / "destinations.toml", provider_settings=None
    )
    outbox = OutboxClient(client, destinations)
    await outbox.enqueue("ops", "fake-webhook", {"via": "outbox_client"}, key="via-client")
    handle = client.get_workflow_handle(item_workflow_id("ops", "via-client"))
    await asyncio.wait_for(handle.result(), 60)
    assert (await outbox.status("ops", "via-client")).status is ItemStatus.SENT
    keyless = OutboxClient(await connect({"TEMPORAL_ADDRESS": stack.temporal}), destinations)
    with pytest.raises(PayloadKeyMissing, match="PAYLOAD_KEYS"):
        await keyless.enqueue("ops", "fake-webhook", {"plain": "text"}, key="via-keyless")

    enqueued = await enqueuing
    assert enqueued.returncode == 0, enqueued.stderr
    assert json.loads(enqueued.stdout)["id"] == "outbox/ops/via-cli"
    web_ui_shown = asyncio.create_task(web_ui())
    try:
        async with AsyncOutboxRest(stack.api) as rest:
            for key in ("via-cli", "via-rest"):
                for _ in range(300):
                    if (await rest.get_item("ops", key)).status == "sent":
                        break
                    await asyncio.sleep(0.2)
                else:
                    raise AssertionError(f"{key} was never sent\n{stack.output()}")

        listing = await in_thread(
            outbox_command, stack, "--output", "table", "items", "list", "ops"
        )
        looking_up = await in_thread(outbox_command, stack, "status", "ops", "never-enqueued")

        # The dashboard, served by the API on its port: the item's deep link opens it, decrypted.
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await page.goto(f"{stack.api}/#/outboxes/ops/items/via-cli")
        await expect(page.locator("#detail")).to_contain_text("the command line", timeout=15_000)
        await expect(page.locator("#detail")).to_contain_text("sent")
        assert errors == []

        listed = await listing
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:4]}
        assert rows == {"via-cli": "sent", "via-rest": "sent", "via-client": "sent"}, listed.stdout
        missing = await looking_up
        assert missing.returncode == 3 and "Traceback" not in missing.stderr

        await web_ui_shown
    finally:
        web_ui_shown.cancel()
