"""The codec server is bounded: payloads and bytes per request (413 past them), and its work runs
off the event loop, so `/healthz` answers while the largest allowed request is in progress."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from durable_outbox_temporal.codec import new_key_setting
from temporalio.api.common.v1 import Payload

from api.codec_work import CodecWorkers
from tests.api.test_items import assert_problem


def wire(count: int, size: int = 8) -> dict[str, object]:
    data = base64.b64encode(b"x" * size).decode()
    return {"payloads": [{"metadata": {}, "data": data} for _ in range(count)]}


async def test_more_payloads_than_the_cap_is_413(api_factory, monkeypatch) -> None:
    monkeypatch.setenv("PAYLOAD_KEYS", new_key_setting("k1"))
    api = await api_factory(codec_max_payloads=3)

    encoded = await api.http.post("/codec/encode", json=wire(3))
    assert encoded.status_code == 200 and len(encoded.json()["payloads"]) == 3
    decoded = await api.http.post("/codec/decode", json=encoded.json())
    assert [p["data"] for p in decoded.json()["payloads"]] == [wire(1)["payloads"][0]["data"]] * 3  # type: ignore[index]
    for route in ("/codec/encode", "/codec/decode"):
        body = assert_problem(await api.http.post(route, json=wire(4)), 413, "too-many-payloads")
        assert "at most 3 (CODEC_MAX_PAYLOADS)" in body["detail"]


async def test_a_codec_body_over_its_own_limit_is_413_while_other_routes_take_more(
    api_factory,
) -> None:
    api = await api_factory(codec_max_request_bytes=2000, max_request_bytes=100_000)

    refused = await api.http.post("/codec/decode", json=wire(1, size=3000))
    body = assert_problem(refused, 413)
    assert "2000 bytes (CODEC_MAX_REQUEST_BYTES)" in body["detail"]
    assert (await api.http.post("/codec/decode", json=wire(1, size=1000))).status_code == 200
    # Elsewhere the general limit holds: a 3 kB body is no 413 there.
    item = await api.http.post(
        "/v1/outboxes/codec/items",
        json={"destination": api.webhook.name, "payload": {"pad": "x" * 3000}},
    )
    assert item.status_code == 202, item.text


class GatedCodec:
    """A codec whose work holds until `gate` exists, as a large request's CPU work does, and
    writes the process it ran in to `started`: run in the API process, it would hold the GIL
    the event loop needs."""

    def __init__(self, started: Path, gate: Path) -> None:
        self.started = started
        self.gate = gate

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.started.write_text(str(os.getpid()))
        deadline = time.monotonic() + 30
        while not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251 - blocking, as CPU work does
        return list(payloads)

    encode = decode


async def _exists(path: Path) -> bool:
    for _ in range(3000):
        if path.exists() and path.read_text():
            return True
        await asyncio.sleep(0.01)
    return False


@pytest.mark.parametrize("route", ["/codec/decode", "/codec/encode"])
async def test_healthz_answers_while_the_codec_works_in_a_process_of_its_own(
    api_factory, route: str, tmp_path: Path
) -> None:
    api = await api_factory()
    started, gate = tmp_path / "started", tmp_path / "gate"
    app = api.http._transport.app  # type: ignore[attr-defined]
    app.state.codec_workers = CodecWorkers(GatedCodec(started, gate), processes=1)

    working = asyncio.create_task(api.http.post(route, json=wire(1000)))
    try:
        assert await _exists(started)
        health = await asyncio.wait_for(api.http.get("/healthz"), timeout=30)
        assert health.status_code == 200
        assert not working.done()  # answered while the codec request was still in progress
        assert int(started.read_text()) != os.getpid()
    finally:
        gate.touch()
        answer = await working
        app.state.codec_workers.close()
    assert answer.status_code == 200


async def test_a_codec_body_that_is_no_payload_list_is_a_problem(api) -> None:
    """The body is parsed in the codec's process, with the same answers as any route's."""
    malformed = api.http.build_request(
        "POST", "/codec/decode", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert_problem(await api.http.send(malformed), 400, "malformed-json")
    wrong = await api.http.post("/codec/decode", json={"payloads": [{"data": 5}]})
    body = assert_problem(wrong, 422)
    assert body["errors"][0]["location"][:2] == ["body", "payloads"], body


_LEAVES_WITHOUT_CLOSE = """
import asyncio, os
from api.codec_work import CodecWorkers

async def main() -> None:
    workers = CodecWorkers(None, 1)
    await workers.run(b'{"payloads": []}', "decode", 10)
    print(*workers._pool._processes, flush=True)  # the pool's process ids
    os._exit(0)  # gone without the lifespan's close, as a SIGKILLed API would be

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (an exited process its new parent has not reaped counts)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.mark.timeout(60)
async def test_the_codec_process_ends_when_its_api_process_is_gone() -> None:
    """An API that ends without closing its codec pool (SIGKILLed) leaves no process behind."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _LEAVES_WITHOUT_CLOSE,
        stdout=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    # One line, then the child is gone (its pool process keeps the pipe open until it ends).
    assert child.stdout is not None
    line = await child.stdout.readline()
    await child.wait()
    pids = [int(pid) for pid in line.split()]
    assert pids, "the pool started no process"
    for _ in range(100):
        if all(_gone(pid) for pid in pids):
            break
        await asyncio.sleep(0.1)
    assert all(_gone(pid) for pid in pids), pids


@pytest.mark.parametrize("route", ["/codec/decode", "/codec/encode"])
async def test_a_codec_body_is_not_scanned_on_the_event_loop(
    api_factory, route: str, monkeypatch
) -> None:
    """The codec's bodies go to its processes unread by the API's JSON body check: a 4 MiB body
    scanned there held every other request of the process (a GET's p99 of 268 ms under
    `bench.bounded_load`, 18 ms without). Base64 text may hold `NaN`, which sent the check on to
    parse the whole body; here any call of it fails the test."""

    def scanned(*_: object) -> None:
        raise AssertionError("the codec's body was scanned on the event loop")

    monkeypatch.setattr("api.errors.json_nesting_exceeds", scanned)
    monkeypatch.setattr("api.errors.unsendable_json_problem", scanned)
    api = await api_factory()
    body = {
        "payloads": [
            {"metadata": {}, "data": base64.b64encode(base64.b64decode("NaNa") * 8).decode()}
        ]
    }
    assert "NaN" in body["payloads"][0]["data"]  # type: ignore[index]

    answer = await api.http.post(route, json=body)

    assert answer.status_code == 200, answer.text
