"""The Temporal Web UI shows a decrypted payload through the API's codec server, while the
server holds ciphertext only."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.codec import EncryptionCodec, data_converter, new_key_setting
from playwright.async_api import Browser, expect
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from devstack.fake_provider import FakeProvider
from devstack.serving import serve_in_background
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from tests.api.conftest import api_settings
from tests.browser.conftest import ARTIFACTS
from tests.conftest import SERVER_STARTUP_TIMEOUT, email_destination
from tests.ports import free_port


@dataclass
class WebUiWithCodec:
    key: str
    ui_port: int
    env: WorkflowEnvironment


@pytest_asyncio.fixture(loop_scope="session")
async def web_ui_with_codec(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[WebUiWithCodec]:
    """A dev server whose Web UI decodes through the API's codec server, with payload keys.

    A fixture the test asks for before `stack_factory`, so the server outlives that fixture's
    teardown: it looks up the test's items on the server (stopped first, each look-up retried
    against a closed port for seconds)."""
    key = new_key_setting("ui-1")
    monkeypatch.setenv("PAYLOAD_KEYS", key)
    ui_port = free_port()
    app = create_app(api_settings(codec_cors_origins=f"http://127.0.0.1:{ui_port}"))
    async with serve_in_background(app) as api_url, httpx.AsyncClient(timeout=60) as http:
        # The API starts its codec's worker process on the first codec call (a second or more):
        # one call with nothing to decode starts it while the dev server starts.
        warming = asyncio.create_task(http.post(f"{api_url}/codec/decode", json={"payloads": []}))
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli_path(),
            ui=True,
            ui_port=ui_port,
            dev_server_startup_timeout=SERVER_STARTUP_TIMEOUT,
            dev_server_extra_args=[
                *dev_server_extra_args(None),
                *["--log-level", "error", "--ui-codec-endpoint", f"{api_url}/codec"],
            ],
        )
        async with env:
            assert (await warming).status_code == 200
            yield WebUiWithCodec(key=key, ui_port=ui_port, env=env)


async def test_the_web_ui_shows_a_decrypted_subject(
    web_ui_with_codec: WebUiWithCodec,
    stack_factory: Any,
    fake_provider: FakeProvider,
    browser: Browser,
) -> None:
    env, ui_port = web_ui_with_codec.env, web_ui_with_codec.ui_port
    subject = f"Decrypted {uuid.uuid4().hex[:8]}"
    codec = EncryptionCodec.from_setting(web_ui_with_codec.key)
    config = env.client.config()
    config["data_converter"] = data_converter(codec)
    client = Client(**config)
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination, env=env, client=client)
    email = {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": "ada@example.com"}]},
        "content": {"subject": subject, "plainText": "hi"},
    }
    item = await stack.enqueue(destination, email, key=f"ui-{uuid.uuid4().hex[:6]}")
    await stack.result(item.item_id)
    await stack.workers.aclose()

    page = await browser.new_page()
    path = f"/namespaces/default/workflows/{quote(item.item_id, safe='')}"
    await page.goto(f"http://127.0.0.1:{ui_port}{path}")
    try:
        # Input and result are shown as the codec server decoded them.
        await expect(page.locator("body")).to_contain_text(subject, timeout=30_000)
    finally:
        await page.screenshot(path=str(ARTIFACTS / "temporal-ui-codec.png"), full_page=True)
