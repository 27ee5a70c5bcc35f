"""The Temporal Web UI shows a decrypted payload through the API's codec server, while the
server holds ciphertext only."""

from __future__ import annotations

import socket
import uuid
from urllib.parse import quote

from durable_outbox_temporal.codec import EncryptionCodec, data_converter, new_key_setting
from playwright.async_api import Browser, expect
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from devstack.serving import serve_in_background
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from tests.api.conftest import api_settings
from tests.browser.conftest import ARTIFACTS
from tests.conftest import SERVER_STARTUP_TIMEOUT, email_destination


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_web_ui_shows_a_decrypted_subject(
    stack_factory, fake_provider, browser: Browser, monkeypatch
) -> None:
    key = new_key_setting("ui-1")
    monkeypatch.setenv("PAYLOAD_KEYS", key)
    ui_port = free_port()
    app = create_app(api_settings(codec_cors_origins=f"http://127.0.0.1:{ui_port}"))
    subject = f"Decrypted {uuid.uuid4().hex[:8]}"
    async with serve_in_background(app) as api_url:
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
            codec = EncryptionCodec.from_setting(key)
            client = Client(**{**env.client.config(), "data_converter": data_converter(codec)})
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
