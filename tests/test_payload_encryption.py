"""Payload encryption: the codec round-trips and rotates keys, the Temporal server's database
holds no plain payload with it (and does without it: the test's control), and the API's codec
server decrypts for the Web UI."""

from __future__ import annotations

import asyncio
import base64
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.codec import (
    CodecKeyError,
    EncryptionCodec,
    KeylessCodec,
    PayloadKeyMissing,
    codec_from_environment,
    data_converter,
    new_key_setting,
)
from durable_outbox_temporal.destinations import DestinationRegistry
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from readmodel.db import create_schema, make_engine
from tests.api.conftest import api_settings
from tests.conftest import SERVER_STARTUP_TIMEOUT, email_destination, unique_name
from worker import build_workers

KEY_1, KEY_2 = new_key_setting("k1"), new_key_setting("k2")


def plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=f'"{text}"'.encode())


async def test_payloads_round_trip_and_keys_rotate() -> None:
    old = EncryptionCodec.from_setting(KEY_1)
    rotated = EncryptionCodec.from_setting(f"{KEY_2},{KEY_1}")

    sealed_old = await old.encode([plain("hello")])
    sealed_new = await rotated.encode([plain("hello")])

    assert (
        b"hello" not in sealed_old[0].data and sealed_old[0].metadata["encryption-key-id"] == b"k1"
    )
    assert sealed_new[0].metadata["encryption-key-id"] == b"k2"  # the first key encrypts
    assert await rotated.decode(sealed_old + sealed_new) == [plain("hello")] * 2
    assert await rotated.decode([plain("before")]) == [plain("before")]  # unencrypted passes
    with pytest.raises(CodecKeyError, match="'k2'"):
        await old.decode(sealed_new)  # a key it does not have
    tampered = Payload()
    tampered.CopyFrom(sealed_old[0])
    tampered.data = tampered.data[:-1] + bytes([tampered.data[-1] ^ 1])
    with pytest.raises(CodecKeyError, match="does not authenticate"):
        await old.decode([tampered])


@pytest.mark.parametrize(
    "setting", ["k1", "k1:not-base64!", f"k1:{base64.b64encode(b'short').decode()}", " , "]
)
def test_unusable_keys_are_refused(setting: str) -> None:
    with pytest.raises(CodecKeyError):
        EncryptionCodec.from_setting(setting)


async def deliver_one(db_file: Path, codec: EncryptionCodec | None, subject: str, fake) -> None:
    """One email delivered on a dev server persisting to `db_file`, with or without `codec`."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        dev_server_startup_timeout=SERVER_STARTUP_TIMEOUT,
        dev_server_extra_args=[*dev_server_extra_args(db_file), "--log-level", "error"],
    )
    engine = make_engine(f"sqlite:///{db_file.parent / 'readmodel.db'}")
    create_schema(engine)
    async with env, AsyncExitStack() as stack, httpx.AsyncClient() as http:
        client = Client(**{**env.client.config(), "data_converter": data_converter(codec)})
        destination = email_destination(fake)
        queue = unique_name("workflows")
        for worker in build_workers(
            client,
            destinations=[destination],
            http_client=http,
            engine=engine,
            workflow_task_queue=queue,
        ):
            await stack.enter_async_context(worker)
        outbox = OutboxClient(client, DestinationRegistry({destination.name: destination}), queue)
        email = {
            "senderAddress": "noreply@example.com",
            "recipients": {"to": [{"address": "ada@example.com"}]},
            "content": {"subject": subject, "plainText": "hi"},
        }
        item = await outbox.enqueue("tests", destination.name, email, key=unique_name("k"))
        view = await client.get_workflow_handle(item.item_id).result()
        assert view["status"] == "sent"
    engine.dispose()


def stored(db_file: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))


async def test_the_servers_database_holds_no_plain_payload(tmp_path, fake_provider) -> None:
    secret, control = f"subject-{uuid.uuid4().hex}", f"subject-{uuid.uuid4().hex}"
    encrypted_db = tmp_path / "encrypted" / "temporal.db"
    plain_db = tmp_path / "plain" / "temporal.db"

    await deliver_one(encrypted_db, EncryptionCodec.from_setting(KEY_1), secret, fake_provider)
    await deliver_one(plain_db, None, control, fake_provider)

    assert secret.encode() not in stored(encrypted_db)
    assert control.encode() in stored(plain_db)  # the check can fail: unencrypted, it is there


async def test_the_codec_server_decrypts_for_the_web_ui(monkeypatch) -> None:
    monkeypatch.setenv("PAYLOAD_KEYS", KEY_1)
    codec = EncryptionCodec.from_setting(KEY_1)
    [sealed] = await codec.encode([plain("ada@example.com")])
    app = create_app(api_settings())
    wire = {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
                "data": base64.b64encode(sealed.data).decode(),
            }
        ]
    }
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        decoded = await http.post(
            "/codec/decode", json=wire, headers={"Origin": "http://127.0.0.1:8233"}
        )
        preflight = await http.options(
            "/codec/decode",
            headers={
                "Origin": "http://127.0.0.1:8233",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace",
            },
        )
        foreign = await http.options(
            "/codec/decode",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )

    assert decoded.status_code == 200, decoded.text
    assert base64.b64decode(decoded.json()["payloads"][0]["data"]) == b'"ada@example.com"'
    assert decoded.headers["access-control-allow-origin"] == "http://127.0.0.1:8233"
    assert preflight.status_code == 200
    assert "access-control-allow-origin" not in foreign.headers


async def test_the_web_ui_authenticates_to_the_codec_server_with_the_session_cookie(
    monkeypatch,
) -> None:
    monkeypatch.setenv("PAYLOAD_KEYS", KEY_1)
    [sealed] = await EncryptionCodec.from_setting(KEY_1).encode([plain("secret")])
    wire = {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
                "data": base64.b64encode(sealed.data).decode(),
            }
        ]
    }
    app = create_app(api_settings(api_token="operator-token"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as dashboard:
        # The dashboard, holding the token, starts the session...
        started = await dashboard.post(
            "/v1/token/session",
            headers={"Authorization": "Bearer operator-token", "Content-Type": "application/json"},
        )
        assert started.status_code == 204
        cookie = started.cookies.get("outbox_session")
    # A session value of its own, never the long-lived token.
    assert cookie and "operator-token" not in cookie
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as web_ui:
        # ...and the Web UI, sending cookies only, decodes; without the cookie it may not.
        refused = await web_ui.post("/codec/decode", json=wire)
        web_ui.cookies.set("outbox_session", cookie, path="/codec")
        decoded = await web_ui.post("/codec/decode", json=wire)
        web_ui.cookies.set("outbox_session", "forged", path="/codec")
        forged = await web_ui.post("/codec/decode", json=wire)

    assert refused.status_code == 401
    assert decoded.status_code == 200, decoded.text
    assert base64.b64decode(decoded.json()["payloads"][0]["data"]) == b'"secret"'
    assert forged.status_code == 403


async def test_a_keyless_process_names_the_key_it_lacks() -> None:
    [sealed] = await EncryptionCodec.from_setting(KEY_1).encode([plain("secret")])
    keyless = KeylessCodec()
    assert await keyless.encode([plain("out")]) == [plain("out")]  # goes out as it is
    assert await keyless.decode([plain("in")]) == [plain("in")]
    with pytest.raises(PayloadKeyMissing, match="key 'k1'") as raised:
        await keyless.decode([sealed])
    assert raised.value.key_id == "k1" and "PAYLOAD_KEYS" in str(raised.value)


def test_the_keys_may_come_from_a_file(tmp_path: Path) -> None:
    keys = tmp_path / "payload-keys"
    keys.write_text(KEY_1 + "\n")
    codec = codec_from_environment({"PAYLOAD_KEYS_FILE": str(keys)})
    assert codec is not None and codec.current == "k1"
    # PAYLOAD_KEYS wins; a file that is missing or empty is refused, by name.
    both = codec_from_environment({"PAYLOAD_KEYS": KEY_2, "PAYLOAD_KEYS_FILE": str(keys)})
    assert both is not None and both.current == "k2"
    with pytest.raises(CodecKeyError, match="missing"):
        codec_from_environment({"PAYLOAD_KEYS_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CodecKeyError, match="holds no key"):
        codec_from_environment({"PAYLOAD_KEYS_FILE": str(tmp_path / "empty")})


async def test_a_client_without_the_stacks_keys_refuses_to_write_plain_payloads(
    dev_env: WorkflowEnvironment, fake_provider, engine, tmp_path: Path
) -> None:
    """A stack that encrypts: a client without its keys enqueues nothing (no plain payload
    reaches a history) and says which key it lacks; with the key file it works."""
    keyed = Client(
        **{
            **dev_env.client.config(),
            "data_converter": data_converter(EncryptionCodec.from_setting(KEY_1)),
        }
    )
    destination = email_destination(fake_provider)
    registry = DestinationRegistry({destination.name: destination})
    queue = unique_name("workflows")
    email = {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": "ada@example.com"}]},
        "content": {"subject": "hi", "plainText": "hi"},
    }
    async with AsyncExitStack() as stack, httpx.AsyncClient() as http:
        for worker in build_workers(
            keyed,
            destinations=[destination],
            http_client=http,
            engine=engine,
            workflow_task_queue=queue,
        ):
            await stack.enter_async_context(worker)
        first = await OutboxClient(keyed, registry, queue).enqueue(
            "tests", destination.name, email, key=unique_name("k")
        )
        await keyed.get_workflow_handle(first.item_id).result()

        # Visibility lists the stack's first workflow a moment after it started.
        for _ in range(100):
            if [w async for w in keyed.list_workflows(f"TaskQueue = '{queue}'", limit=1)]:
                break
            await asyncio.sleep(0.1)
        keyless = OutboxClient(dev_env.client, registry, queue)
        with pytest.raises(PayloadKeyMissing) as refused:
            await keyless.enqueue("tests", destination.name, email, key=unique_name("plain"))
        assert refused.value.key_id == "k1" and queue in str(refused.value)
        with pytest.raises(PayloadKeyMissing):
            await keyless.status("tests", first.key)

        keys = tmp_path / "payload-keys"
        keys.write_text(KEY_1)
        from_file = Client(
            **{
                **dev_env.client.config(),
                "data_converter": data_converter(
                    codec_from_environment({"PAYLOAD_KEYS_FILE": str(keys)})
                ),
            }
        )
        view = await OutboxClient(from_file, registry, queue).status("tests", first.key)
        assert view.status == "sent"
