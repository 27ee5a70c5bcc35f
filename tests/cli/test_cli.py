"""The `outbox` command against the real API served on a loopback port."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli import main
from tests.api.conftest import serve_stack
from tests.conftest import webhook_destination


async def run(api_url: str, *argv: str) -> None:
    # The CLI is synchronous; a thread keeps this loop free to serve the API it calls.
    await asyncio.to_thread(main, ["--api", api_url, *argv])


async def test_enqueue_status_and_tail(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    payload = json.dumps({"hello": "cli"})

    await run(
        api.url,
        "enqueue",
        "cli",
        "--destination",
        api.webhook.name,
        "--payload",
        payload,
        "--key",
        "c1",
    )
    created = json.loads(capsys.readouterr().out)
    await api.stack.result(created["id"])
    await run(api.url, "status", "cli", "c1")
    status = json.loads(capsys.readouterr().out)
    await run(api.url, "tail", "cli", "--since", "0", "--count", "2")
    tailed = capsys.readouterr().out.splitlines()

    assert created["created"] is True and status["status"] == "sent"
    assert "c1  enqueued -> queued" in tailed[0] and "c1  sent -> sent" in tailed[1]


async def test_batch_file_reports_progress_and_bad_lines(
    served_api_factory, capsys, tmp_path: Path
) -> None:
    api = await served_api_factory()
    lines = [
        {"destination": api.webhook.name, "payload": {"n": 1}, "idempotency_key": "f1"},
        {"destination": "nowhere", "payload": {}},
        {"destination": api.webhook.name, "payload": {"n": 3}},
    ]
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(line) for line in lines) + "\n")

    with pytest.raises(SystemExit) as exit_status:
        await run(api.url, "enqueue", "cli", "--file", str(items))

    err = capsys.readouterr().err
    assert exit_status.value.code == 7  # a bad line: invalid input, after the good ones went
    assert "line 2: unknown destination 'nowhere'" in err
    assert "[##############################] 3/3" in err
    assert "created 2, existing 0, failed 1" in err


async def test_errors_are_one_line_not_tracebacks(served_api_factory, capsys) -> None:
    api = await served_api_factory()

    with pytest.raises(SystemExit) as missing:
        await run(api.url, "status", "cli", "never-enqueued")
    with pytest.raises(SystemExit) as unreachable:
        await run("http://127.0.0.1:9", "status", "cli", "x")

    err = capsys.readouterr().err
    assert (missing.value.code, unreachable.value.code) == (3, 5)  # not found, unavailable
    assert "HTTP 404: Item not found" in err and "cannot reach the API" in err


async def test_destinations_pause_resume_and_rate(
    dev_env, stack_factory, fake_provider, capsys
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    async with serve_stack(stack) as url:
        await run(url, "destinations", webhook.name, "--pause", "--reason", "cli test")
        paused = json.loads(capsys.readouterr().out)
        await run(url, "destinations", webhook.name, "--resume", "--submit-rate", "3")
        resumed = json.loads(capsys.readouterr().out)
        await run(url, "destinations")
        listed = json.loads(capsys.readouterr().out)
        await run(url, "destinations", webhook.name, "--disable", "--reason", "retired")
        disabled = json.loads(capsys.readouterr().out)
        await run(url, "destinations", webhook.name, "--output", "table")
        disabled_table = capsys.readouterr().out
        await run(url, "destinations", webhook.name, "--enable")
        enabled = json.loads(capsys.readouterr().out)
        await run(url, "purge", "empty-outbox", "--destination", webhook.name)
        purged = json.loads(capsys.readouterr().out)
        await run(url, "purge", "empty-outbox", "--no-wait")
        started = json.loads(capsys.readouterr().out)

    assert paused["paused"] is True and paused["pause_reason"] == "cli test"
    assert resumed["paused"] is False and resumed["submit"] == {"rate": 3.0, "source": "api"}
    assert webhook.name in [d["name"] for d in listed]
    assert disabled["disabled"] is True and disabled["pause_reason"].endswith("by request: retired")
    assert "disabled since " in disabled_table
    assert enabled["disabled"] is False and enabled["submit"] == {"rate": 3.0, "source": "api"}
    assert (purged["state"], purged["done"]) == ("completed", True)
    assert (purged["cancelled"], purged["skipped"], purged["keys"]) == (0, 0, [])
    assert (started["state"], started["done"]) == ("running", False)


async def test_purge_follows_its_batch_to_the_end(
    dev_env, stack_factory, fake_provider, capsys
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    later = datetime.now(UTC) + timedelta(hours=1)
    keys = [f"later-{n}" for n in range(3)]
    for key in keys:
        await stack.outbox.enqueue("cli-purge", webhook.name, {"k": key}, key=key, not_before=later)
    for _ in range(200):  # visibility trails the starts by a moment
        if len(await stack.outbox.queued_keys("cli-purge")) == len(keys):
            break
        await asyncio.sleep(0.05)
    async with serve_stack(stack) as url:
        await run(url, "purge", "cli-purge", "--reason", "cli purge")
        captured = capsys.readouterr()

    purged = json.loads(captured.out)
    assert (purged["state"], purged["cancelled"], purged["keys"]) == ("completed", 3, keys)
    assert "3 cancelled, 0 skipped, 1 page(s) (completed)" in captured.err
    for key in keys:
        assert (await stack.outbox.status("cli-purge", key)).status == "cancelled"


async def test_destinations_show_state_and_flow_rules_and_change_them(
    dev_env, stack_factory, fake_provider, capsys
) -> None:
    webhook = webhook_destination(fake_provider)
    name = webhook.name
    stack = await stack_factory(webhook, env=dev_env)
    async with serve_stack(stack) as url:
        await run(url, "destinations", name, "--flow", "breaker=false", "--flow", "max_in_flight=5")
        changed = json.loads(capsys.readouterr().out)
        await run(url, "--output", "table", "destinations", name)
        shown = capsys.readouterr().out
        await run(url, "--output", "table", "destinations")
        listed = capsys.readouterr().out
        await run(url, "destinations", name, "--flow", "max_in_flight=null")
        reverted = json.loads(capsys.readouterr().out)
        with pytest.raises(SystemExit) as unknown_field:
            await run(url, "destinations", name, "--flow", "colour=blue")
        with pytest.raises(SystemExit) as not_a_pair:
            await run(url, "destinations", name, "--flow", "breaker")

    policy = changed["flow_policy"]
    assert (policy["breaker"]["value"], policy["breaker"]["source"]) == (False, "api")
    assert (policy["max_in_flight"]["value"], policy["max_in_flight"]["source"]) == (5, "api")
    assert "state      running" in shown and "flow policy in force:" in shown
    assert "in_flight  0 of 5 out now" in shown
    breaker_line = next(line for line in shown.splitlines() if line.split()[:1] == ["breaker"])
    assert breaker_line.split()[1] == "false" and "set by the API at" in breaker_line
    window = next(line for line in shown.splitlines() if "breaker_window_s" in line)
    assert "set by the API" not in window  # the file's value
    header, *rows = listed.splitlines()
    assert header.split() == ["NAME", "PROVIDER", "STATE", "SUBMIT", "POLL", "REASON"]
    assert any(row.split()[:3] == [name, "webhook", "running"] for row in rows)
    assert reverted["flow_policy"]["max_in_flight"] == {
        "value": None,
        "source": "file",
        "changed_at": None,
    }
    assert (unknown_field.value.code, not_a_pair.value.code) == (7, 2)
    err = capsys.readouterr().err
    assert "colour" in err and "not FIELD=VALUE" in err


async def test_erase_by_subject_follows_its_batch_to_the_end(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    for key, subject in (("e1", "ada@example.com"), ("e2", "bea@example.com")):
        await run(
            api.url,
            "enqueue",
            "cli-erase",
            "--destination",
            api.webhook.name,
            "--payload",
            json.dumps({"to": subject}),
            "--key",
            key,
            "--subject",
            subject,
        )
        await api.stack.result(json.loads(capsys.readouterr().out)["id"])

    await run(api.url, "erase", "cli-erase", "--subject", "ada@example.com")
    captured = capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        await run(api.url, "erase", "cli-erase")

    erased = json.loads(captured.out)
    assert (erased["state"], erased["erased"], erased["skipped"]) == ("completed", 1, 0)
    assert "1 erased, 0 skipped, 1 page(s) (completed)" in captured.err
    assert usage.value.code == 2 and "--key-prefix or --subject" in capsys.readouterr().err
    await run(api.url, "status", "cli-erase", "e1")
    assert json.loads(capsys.readouterr().out)["payload"] is None
    await run(api.url, "status", "cli-erase", "e2")
    assert json.loads(capsys.readouterr().out)["payload"] == {"to": "bea@example.com"}
