"""The CLI's conventions against the real API: --version, --output, exit codes per problem,
a closed pipe, `items list` filters, aggregate commands and a JSONL file with bad lines."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key

import cli
from cli import ExitCode, exit_code_for
from configuration.version import VERSION
from tests.cli.test_cli import run

# The installed entry point, as a user's shell runs it.
OUTBOX = str(Path(sys.executable).parent / "outbox")


async def exit_code(api_url: str, *argv: str) -> int:
    """The code the CLI exits with (0 when it returns)."""
    try:
        await run(api_url, *argv)
    except SystemExit as ended:
        return int(ended.code or 0)
    return 0


async def wait_for(check: Callable[[], Awaitable[bool]], attempts: int = 200) -> None:
    for _ in range(attempts):  # the read model trails a workflow's end by a moment
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never came true")


async def enqueue(api: Any, outbox: str, key: str, payload: dict[str, Any]) -> None:
    await run(
        api.url,
        "enqueue",
        outbox,
        "--destination",
        api.webhook.name,
        "--payload",
        json.dumps(payload),
        "--key",
        key,
    )


def run_entry_point(
    *argv: str, stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [OUTBOX, *argv], stdout=stdout, stderr=subprocess.PIPE, timeout=60, check=False
    )


async def test_version_is_the_releases(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        await run("http://127.0.0.1:9", "--version")
    shown = await asyncio.to_thread(run_entry_point, "--version")

    assert ended.value.code == 0
    assert capsys.readouterr().out == f"outbox {VERSION}\n"
    assert shown.returncode == 0 and shown.stdout.decode() == f"outbox {VERSION}\n"


async def test_json_is_the_apis_answer_and_a_table_is_for_a_terminal(
    served_api_factory, capsys
) -> None:
    api = await served_api_factory()
    outbox = f"cli-out-{uuid.uuid4().hex[:6]}"
    await enqueue(api, outbox, "t-1", {"n": 1})
    await api.stack.result(item_workflow_id(outbox, "t-1"))
    capsys.readouterr()

    async with httpx.AsyncClient(base_url=api.url) as http:

        async def ended() -> bool:
            answer = await http.get(f"/v1/outboxes/{outbox}/items/t-1")
            return bool(answer.json()["source"] == "read-model")

        await wait_for(ended)
        straight = (await http.get(f"/v1/outboxes/{outbox}/items/t-1")).json()
    await run(api.url, "status", outbox, "t-1")
    piped = capsys.readouterr().out
    await run(api.url, "status", outbox, "t-1", "--output", "table")
    table = capsys.readouterr().out.splitlines()
    await run(api.url, "--output", "table", "items", "list", outbox)
    listed = capsys.readouterr().out.splitlines()
    on_a_terminal = await asyncio.to_thread(terminal_output, api.url, "status", outbox, "t-1")

    # In a pipe: the API's JSON exactly as the CLI has always printed it (scripts parse it).
    assert piped == json.dumps(straight, indent=2, sort_keys=True) + "\n"
    assert any(line.split() == ["status", "sent"] for line in table)
    assert listed[0].split() == ["KEY", "STATUS", "DESTINATION", "ATTEMPTS", "CREATED_AT",
                                 "UPDATED_AT"]  # fmt: skip
    assert listed[1].split()[:4] == ["t-1", "sent", api.webhook.name, "1"]
    assert "status" in on_a_terminal and "sent" in on_a_terminal
    assert not on_a_terminal.lstrip().startswith("{")


def terminal_output(*argv: str) -> str:
    """What the entry point prints with a terminal for its stdout."""
    controller, terminal = pty.openpty()
    with subprocess.Popen([OUTBOX, "--api", *argv], stdout=terminal) as process:
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=60)
    os.close(controller)
    return b"".join(chunks).decode()


async def test_a_closed_pipe_ends_quietly(served_api_factory) -> None:
    api = await served_api_factory()
    outbox = f"cli-pipe-{uuid.uuid4().hex[:6]}"
    await enqueue(api, outbox, "p-1", {"n": 1})

    def into_a_closed_pipe() -> subprocess.CompletedProcess[bytes]:
        reader, writer = os.pipe()
        os.close(reader)  # the reader is gone before the CLI writes, as `head -1` once done
        try:
            return run_entry_point("--api", api.url, "status", outbox, "p-1", stdout=writer)
        finally:
            os.close(writer)

    def into_head() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["bash", "-c", f'"{OUTBOX}" --api {api.url} items list {outbox} --all | head -1'],
            capture_output=True,
            timeout=60,
            check=False,
        )

    closed = await asyncio.to_thread(into_a_closed_pipe)
    headed = await asyncio.to_thread(into_head)

    assert closed.returncode == ExitCode.PIPE_CLOSED == 141
    assert closed.stderr == b""
    assert headed.stdout == b"{\n" and b"Traceback" not in headed.stderr


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, 7), (401, 6), (403, 6), (404, 3), (409, 4), (412, 4), (413, 7), (415, 7), (422, 7),
        (429, 5), (500, 1), (502, 5), (503, 5), (504, 5),
    ],
)  # fmt: skip
def test_each_problem_status_has_its_exit_code(status: int, code: int) -> None:
    assert exit_code_for(status) == code


async def test_problems_exit_with_their_codes_and_one_line(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    outbox = f"cli-exit-{uuid.uuid4().hex[:6]}"
    await enqueue(api, outbox, "e-1", {"n": 1})
    capsys.readouterr()

    codes = {
        "not found": await exit_code(api.url, "status", outbox, "never-enqueued"),
        "conflict": await exit_code(api.url, "enqueue", outbox, "--destination",
                                    api.webhook.name, "--payload", '{"n": 2}', "--key", "e-1"),
        "invalid": await exit_code(api.url, "enqueue", outbox, "--destination",
                                   api.webhook.name, "--payload", "{}", "--delay-seconds", "-5"),
        "bad json": await exit_code(api.url, "enqueue", outbox, "--destination",
                                    api.webhook.name, "--payload", "{oops"),
        "usage": await exit_code(api.url, "enqueue", outbox, "--payload", "{}"),
        "unknown option": await exit_code(api.url, "status", outbox, "e-1", "--colour"),
        "unavailable": await exit_code("http://127.0.0.1:9", "status", outbox, "e-1"),
    }  # fmt: skip
    err = capsys.readouterr().err
    guarded = await served_api_factory(api_token="cli-secret")
    codes["no token"] = await exit_code(guarded.url, "--token", "", "status", outbox, "x")
    codes["wrong token"] = await exit_code(guarded.url, "--token", "wrong", "status", outbox, "x")
    unauthorized = capsys.readouterr().err

    assert codes == {
        "not found": 3,
        "conflict": 4,
        "invalid": 7,
        "bad json": 7,
        "usage": 2,
        "unknown option": 2,
        "unavailable": 5,
        "no token": 6,
        "wrong token": 6,
    }
    assert "outbox: HTTP 404: Item not found: " in err
    assert "outbox: HTTP 409: Idempotency-Key reused: " in err
    assert "outbox: HTTP 422: Invalid request: " in err and "delay_seconds" in err
    assert "outbox: HTTP 401: " in unauthorized and "outbox: HTTP 403: " in unauthorized
    assert "Traceback" not in err + unauthorized


async def test_items_list_filters_and_pages(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    outbox = f"cli-list-{uuid.uuid4().hex[:6]}"
    await api.stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id(outbox, "b-1")), [{"status": 400}]
    )
    for key in ("a-1", "a-2", "b-1"):
        await enqueue(api, outbox, key, {"key": key})
    for key in ("a-1", "a-2"):
        await api.stack.result(item_workflow_id(outbox, key))
    await api.stack.failure(item_workflow_id(outbox, "b-1"))
    capsys.readouterr()

    async def keys(*filters: str) -> list[str]:
        await run(api.url, "items", "list", outbox, *filters)
        return [item["key"] for item in json.loads(capsys.readouterr().out)["items"]]

    async def all_ended() -> bool:
        return sorted(await keys("--status", "sent")) == ["a-1", "a-2"]

    await wait_for(all_ended)
    await run(api.url, "items", "list", outbox, "--limit", "2")
    first = json.loads(capsys.readouterr().out)

    assert await keys("--status", "failed") == ["b-1"]
    assert await keys("--key-prefix", "a-") == ["a-2", "a-1"]  # newest first
    assert await keys("--destination", api.webhook.name) == ["b-1", "a-2", "a-1"]
    assert await keys("--destination", "elsewhere") == []
    assert [item["key"] for item in first["items"]] == ["b-1", "a-2"] and first["next_cursor"]
    assert await keys("--limit", "2", "--cursor", first["next_cursor"]) == ["a-1"]
    assert await keys("--limit", "1", "--all") == ["b-1", "a-2", "a-1"]


async def test_aggregate_command_state_and_events(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    flight = f"BA{uuid.uuid4().hex[:6]}"
    seat = json.dumps({"seat": "1A", "passenger_id": "p1"})

    await run(api.url, "aggregates", "command", "flight", flight, "open",
              '{"seats": ["1A", "1B"]}', "--idempotency-key", f"open-{flight}")  # fmt: skip
    opened = json.loads(capsys.readouterr().out)
    await run(api.url, "aggregates", "command", "flight", flight, "assign_seat", seat,
              "--idempotency-key", "seat-p1")  # fmt: skip
    seated = json.loads(capsys.readouterr().out)
    await run(api.url, "aggregates", "command", "flight", flight, "assign_seat", seat,
              "--idempotency-key", "seat-p1")  # fmt: skip
    repeated = json.loads(capsys.readouterr().out)
    taken = await exit_code(api.url, "aggregates", "command", "flight", flight, "assign_seat",
                            json.dumps({"seat": "1A", "passenger_id": "p2"}))  # fmt: skip
    unknown = await exit_code(api.url, "aggregates", "command", "flight", flight, "fly", "{}")
    invalid = await exit_code(api.url, "aggregates", "command", "flight", flight, "assign_seat",
                              '{"seat": 7}')  # fmt: skip
    err = capsys.readouterr().err
    await run(api.url, "aggregates", "state", "flight", flight)
    state = json.loads(capsys.readouterr().out)
    await run(api.url, "--output", "table", "aggregates", "command", "flight", flight,
              "assign_seat", json.dumps({"seat": "1B", "passenger_id": "p3"}))  # fmt: skip
    table = capsys.readouterr().out.splitlines()

    async def all_events() -> bool:
        await run(api.url, "aggregates", "events", "flight", flight, "--limit", "1", "--all")
        events = json.loads(capsys.readouterr().out)
        return [event["seq"] for event in events] == [1, 2, 3]

    await wait_for(all_events)
    await run(api.url, "aggregates", "types")
    types = json.loads(capsys.readouterr().out)
    await run(api.url, "aggregates", "list", "flight", "--limit", "1", "--all")
    flights = json.loads(capsys.readouterr().out)["items"]

    assert (opened["version"], seated["version"]) == (1, 2)
    assert [event["type"] for event in seated["events"]] == ["SeatAssigned"]
    assert repeated["duplicate"] is True and repeated["events"] == []
    assert (taken, unknown, invalid) == (4, 3, 7)
    assert "HTTP 409: Command refused: " in err and "HTTP 404: Unknown command: " in err
    assert state["version"] == 2 and state["state"]["seats"] == {"1A": "p1", "1B": None}
    assert table[0].split()[:3] == ["SEQ", "TYPE", "RECORDED_AT"]
    assert table[1].split()[:2] == ["3", "SeatAssigned"]
    assert "version: 3" in table
    flight_type = next(entry for entry in types if entry["type"] == "flight")
    assert "assign_seat" in flight_type["commands"]
    assert {"id": flight, "version": 3} in [
        {"id": entry["id"], "version": entry["version"]} for entry in flights
    ]


async def test_a_jsonl_file_sends_its_good_lines_and_names_the_bad(
    served_api_factory, capsys, tmp_path: Path
) -> None:
    api = await served_api_factory()
    outbox = f"cli-file-{uuid.uuid4().hex[:6]}"
    good = {"destination": api.webhook.name, "payload": {"n": 1}, "idempotency_key": "j-1"}
    lines = [
        json.dumps(good),
        '{"destination": broken',
        "[1, 2]",
        "",
        json.dumps({"destination": "nowhere", "payload": {}}),
        json.dumps({**good, "idempotency_key": "j-6"}),
    ]
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(lines) + "\n")

    code = await exit_code(api.url, "enqueue", outbox, "--file", str(items))
    err = capsys.readouterr().err
    for key in ("j-1", "j-6"):
        await run(api.url, "status", outbox, key)
        assert json.loads(capsys.readouterr().out)["key"] == key

    assert code == 7
    assert "line 2: not JSON: " in err and "line 3: not a JSON object" in err
    assert "line 5: unknown destination 'nowhere'" in err  # the blank line 4 still counts
    assert "created 2, existing 0, failed 3" in err
    assert "Traceback" not in err


def test_a_waiting_item_says_in_words_what_holds_it() -> None:
    item = {
        "status": "queued",
        "recipients": [],
        "links": {"self": "/v1/outboxes/o/items/k"},
        "waiting_on": [
            {"reason": "paused", "detail": "destination paused: maintenance", "until": None},
            {"reason": "debounce", "detail": "debounce window", "until": "2026-11-27T01:40:00Z"},
        ],
    }

    shown = cli.render_table(item)

    assert (
        "waiting_on  destination paused: maintenance; debounce window (until 2026-11-27T01:40:00Z)"
        in shown
    )
    assert "status      queued" in shown
