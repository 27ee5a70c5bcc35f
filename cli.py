"""`outbox`: the command line for the REST API (and `outbox dev` for the whole local stack).

    outbox enqueue demo --destination fake-webhook --payload '{"hello": "world"}' --key k1
    outbox enqueue demo --file items.jsonl          # one JSON item per line, sent in batches
    outbox status demo k1
    outbox tail demo [--since ID]                   # follow the outbox live
    outbox purge demo [--destination D]             # cancel all not yet submitted
    outbox destinations [NAME] [--pause --reason R | --resume] [--submit-rate N]
    outbox cancel demo k1 | outbox redrive demo k1 | outbox redrive demo --all-failed
    outbox dev                                      # what `make dev` runs

`--api` (or OUTBOX_API_URL) picks the API; API_TOKEN, when set, is sent as a bearer token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

BATCH_SIZE = 100


class CliError(Exception):
    """A failure to report as one line and exit status 1."""


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    return httpx.Client(base_url=args.api, headers=headers, timeout=30)


def _check(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        problem = response.json()
        message = f"{problem.get('title', 'error')}: {problem.get('detail', '')}"
    except ValueError:
        message = response.text[:200]
    raise CliError(f"HTTP {response.status_code}: {message}")


def _items_path(outbox: str, key: str | None = None) -> str:
    path = f"/v1/outboxes/{quote(outbox, safe='')}/items"
    return path if key is None else f"{path}/{quote(key, safe='')}"


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def enqueue(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.file:
            _enqueue_file(client, args.outbox, Path(args.file))
            return
        if not args.destination or args.payload is None:
            raise CliError("enqueue needs --destination and --payload (or --file)")
        body: dict[str, Any] = {"destination": args.destination, "payload": _json(args.payload)}
        if args.not_before:
            body["not_before"] = args.not_before
        if args.delay_seconds is not None:
            body["delay_seconds"] = args.delay_seconds
        headers = {"Idempotency-Key": args.key} if args.key else {}
        _print(_check(client.post(_items_path(args.outbox), json=body, headers=headers)))


def _enqueue_file(client: httpx.Client, outbox: str, path: Path) -> None:
    items = list(_read_jsonl(path))
    created = existing = failed = 0
    for start in range(0, len(items), BATCH_SIZE):
        batch = items[start : start + BATCH_SIZE]
        result = _check(client.post(f"{_items_path(outbox)}:batch", json={"items": batch}))
        created, existing, failed = (
            created + result["created"],
            existing + result["existing"],
            failed + result["failed"],
        )
        for entry in result["results"]:
            if entry["problem"]:
                line = start + entry["index"] + 1
                print(f"line {line}: {entry['problem']['detail']}", file=sys.stderr)
        _progress(start + len(batch), len(items))
    print(f"\ncreated {created}, existing {existing}, failed {failed}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise CliError(f"{path}:{number}: not JSON: {err}") from err


def _progress(done: int, total: int, width: int = 30) -> None:
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


def status(args: argparse.Namespace) -> None:
    with _client(args) as client:
        _print(_check(client.get(_items_path(args.outbox, args.key))))


def cancel(args: argparse.Namespace) -> None:
    with _client(args) as client:
        _print(_check(client.post(f"{_items_path(args.outbox, args.key)}/cancel", json={})))


def redrive(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.all_failed:
            url = f"{_items_path(args.outbox)}:redrive-failed"
            _print(_check(client.post(url, json={"destination": args.destination})))
        elif args.key:
            _print(_check(client.post(f"{_items_path(args.outbox, args.key)}/redrive")))
        else:
            raise CliError("redrive needs a KEY or --all-failed")


def purge(args: argparse.Namespace) -> None:
    with _client(args) as client:
        body: dict[str, Any] = {"destination": args.destination}
        if args.reason:
            body["reason"] = args.reason
        _print(_check(client.post(f"{_items_path(args.outbox)}:purge", json=body)))


def destinations(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.name is None:
            _print(_check(client.get("/v1/destinations")))
            return
        url = f"/v1/destinations/{quote(args.name, safe='')}"
        change: dict[str, Any] = {}
        if args.pause or args.resume:
            change["paused"] = bool(args.pause)
        if args.submit_rate is not None:
            change["submit_rate"] = args.submit_rate
        if args.poll_rate is not None:
            change["poll_rate"] = args.poll_rate
        if args.reason is not None:
            change["reason"] = args.reason
        response = client.patch(url, json=change) if change else client.get(url)
        _print(_check(response))


def tail(args: argparse.Namespace) -> None:
    from websockets.sync.client import connect

    url = args.api.replace("http", "ws", 1) + f"/v1/outboxes/{quote(args.outbox, safe='')}/live"
    query = [f"since={args.since}"] if args.since is not None else []
    if args.token:
        query.append(f"token={quote(args.token)}")
    if query:
        url += "?" + "&".join(query)
    with connect(url) as socket:
        for seen, message in enumerate(socket, start=1):
            event = json.loads(message)
            detail = f"  {event['detail']}" if event.get("detail") else ""
            transition = f"{event['type']} -> {event['status']}"
            print(
                f"{event['at']}  #{event['id']}  {event['key']}  {transition}{detail}", flush=True
            )
            if args.count is not None and seen >= args.count:
                return


def dev(args: argparse.Namespace) -> None:
    from devstack.dev import main as run_dev_stack

    raise SystemExit(run_dev_stack())


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CliError(f"--payload is not JSON: {err}") from err


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--api", default=os.environ.get("OUTBOX_API_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("API_TOKEN", "").split(",")[0] or None)
    commands = parser.add_subparsers(dest="command", required=True)

    command = commands.add_parser("enqueue", help="enqueue one item, or a JSONL file in batches")
    command.add_argument("outbox")
    command.add_argument("--destination")
    command.add_argument("--payload", help="the item's JSON payload")
    command.add_argument("--key", help="Idempotency-Key (generated when absent)")
    command.add_argument("--not-before", help="RFC 3339 time with zone")
    command.add_argument("--delay-seconds", type=float, help="or: due this many seconds from now")
    command.add_argument(
        "--file", help="JSONL: one {destination, payload, idempotency_key?} per line"
    )
    command.set_defaults(run=enqueue)

    for name, run, help_text in (
        ("status", status, "an item's status"),
        ("cancel", cancel, "cancel a queued item"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("outbox")
        command.add_argument("key")
        command.set_defaults(run=run)

    command = commands.add_parser("redrive", help="redrive a failed item, or all failed ones")
    command.add_argument("outbox")
    command.add_argument("key", nargs="?")
    command.add_argument("--all-failed", action="store_true")
    command.add_argument("--destination", help="with --all-failed: only this destination")
    command.set_defaults(run=redrive)

    command = commands.add_parser("purge", help="cancel every item not yet submitted")
    command.add_argument("outbox")
    command.add_argument("--destination", help="only this destination's items")
    command.add_argument("--reason", help="recorded on each cancelled item")
    command.set_defaults(run=purge)

    command = commands.add_parser(
        "destinations", help="rates in force; pause, resume or re-rate one destination"
    )
    command.add_argument("name", nargs="?", help="one destination (all without it)")
    switch = command.add_mutually_exclusive_group()
    switch.add_argument("--pause", action="store_true", help="stop every new submit and poll")
    switch.add_argument("--resume", action="store_true")
    command.add_argument("--submit-rate", type=float, help="submits per second, at once")
    command.add_argument("--poll-rate", type=float, help="polls per second, at once")
    command.add_argument("--reason", help="why (shown while paused)")
    command.set_defaults(run=destinations)

    command = commands.add_parser("tail", help="follow an outbox's events live")
    command.add_argument("outbox")
    command.add_argument("--since", type=int, help="replay events after this id first")
    command.add_argument("--count", type=int, help="stop after this many events")
    command.set_defaults(run=tail)

    command = commands.add_parser("dev", help="run the whole local stack (make dev)")
    command.set_defaults(run=dev)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except CliError as err:
        print(f"outbox: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except httpx.TransportError as err:
        print(f"outbox: cannot reach the API at {args.api}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
