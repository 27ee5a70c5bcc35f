"""`outbox`: the command line for the REST API (and `outbox dev` for the whole local stack).

    outbox enqueue demo --destination fake-webhook --payload '{"hello": "world"}' --key k1
    outbox enqueue demo --file items.jsonl          # one JSON item per line, sent in batches
    outbox status demo k1
    outbox tail demo [--since ID]                   # follow the outbox live
    outbox purge demo [--destination D] [--no-wait] # cancel all not yet submitted (a batch)
    outbox enqueue demo ... --ordering-key acct-7   # in order after acct-7's earlier items
    outbox lanes demo [KEY] [--status halted] [--redrive | --skip --reason R]
    outbox schedules create daily --outbox demo --cron '0 6 * * *' --item '{"destination": ...}'
    outbox schedules list | show ID | pause ID [--note N] | unpause ID | trigger ID | delete ID
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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

BATCH_SIZE = 100


class CliError(Exception):
    """A failure to report as one line and exit status 1."""


def _client(args: argparse.Namespace) -> httpx.Client:
    # Every state-changing route takes JSON (a 415 otherwise), body or no body.
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
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
        if args.ordering_key:
            body["ordering_key"] = args.ordering_key
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
    """Start a purge batch and follow it to its end (unless --no-wait); exit 1 if it failed."""
    with _client(args) as client:
        body: dict[str, Any] = {"destination": args.destination}
        if args.reason:
            body["reason"] = args.reason
        batch = _check(client.post(f"{_items_path(args.outbox)}:purge", json=body))
        if not args.no_wait:
            batch = _follow(client, batch, _purge_progress)
        _print(batch)
    if batch["state"] not in ("running", "completed"):
        print(f"purge {batch['state']}: {batch.get('failure')}", file=sys.stderr)
        raise SystemExit(1)


def _purge_progress(batch: dict[str, Any]) -> str:
    return f"{batch['cancelled']} cancelled, {batch['skipped']} skipped, {batch['pages']} page(s)"


def _follow(
    client: httpx.Client, batch: dict[str, Any], progress: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """Poll a batch at its `links.self` until it ends, its progress on one stderr line."""
    while batch["state"] == "running" and not batch["done"]:
        sys.stderr.write(f"\r{progress(batch)}")
        sys.stderr.flush()
        time.sleep(0.5)
        batch = _check(client.get(batch["links"]["self"]))
    sys.stderr.write(f"\r{progress(batch)} ({batch['state']})\n")
    return batch


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


def lanes(args: argparse.Namespace) -> None:
    path = f"/v1/outboxes/{quote(args.outbox, safe='')}/lanes"
    with _client(args) as client:
        if args.ordering_key is None:
            if args.redrive or args.skip:
                raise CliError("--redrive and --skip need the lane's ORDERING_KEY")
            params = {"status": args.status} if args.status else {}
            _print(_check(client.get(path, params=params)))
            return
        lane = f"{path}/{quote(args.ordering_key, safe='')}"
        if args.redrive:
            _print(_check(client.post(f"{lane}/redrive")))
        elif args.skip:
            body = {"reason": args.reason} if args.reason else {}
            _print(_check(client.post(f"{lane}/skip", json=body)))
        else:
            _print(_check(client.get(lane)))


def _redrive_progress(batch: dict[str, Any]) -> str:
    return f"{batch['redriven']} redriven, {batch['skipped']} skipped, {batch['pages']} page(s)"


def dead_letters(args: argparse.Namespace) -> None:
    path = f"/v1/outboxes/{quote(args.outbox, safe='')}"
    which = {
        "destination": args.destination,
        "error_code": args.error_code,
        "failed_from": args.failed_from,
        "failed_to": args.failed_to,
    }
    which = {name: value for name, value in which.items() if value is not None}
    with _client(args) as client:
        if args.discard:
            url = f"{path}/dead-letters/{quote(args.discard, safe='')}/discard"
            _print(_check(client.post(url, json={"reason": args.reason} if args.reason else {})))
        elif args.redrive_all:
            batch = _check(client.post(f"{path}/dead-letters:redrive", json=which))
            if args.wait:
                batch = _follow(client, batch, _redrive_progress)
            _print(batch)
        elif args.batch:
            _print(_check(client.get(f"{path}/redrive-batches/{quote(args.batch, safe='')}")))
        else:
            params = {**which, "include_discarded": "true"} if args.all else which
            _print(_check(client.get(f"{path}/dead-letters", params=params)))


def schedules(args: argparse.Namespace) -> None:
    path = "/v1/schedules"
    with _client(args) as client:
        if args.action == "list":
            _print(_check(client.get(path)))
            return
        if args.action == "create":
            _print(_check(client.post(path, json=_schedule_body(args))))
            return
        schedule = f"{path}/{quote(args.id, safe='')}"
        if args.action == "show":
            _print(_check(client.get(schedule)))
        elif args.action in ("pause", "unpause"):
            body = {"note": args.note} if args.note else {}
            _print(_check(client.post(f"{schedule}/{args.action}", json=body)))
        elif args.action == "trigger":
            _print(_check(client.post(f"{schedule}/trigger")))
        else:
            response = client.delete(schedule)
            if not response.is_success:
                _check(response)
            _print({"id": args.id, "deleted": True})


def _schedule_body(args: argparse.Namespace) -> dict[str, Any]:
    """The create body: `--file` (the API's JSON body), then each flag given on top of it."""
    body: dict[str, Any] = {}
    if args.file:
        try:
            body = json.loads(Path(args.file).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CliError(f"{args.file}: {err}") from err
    body["id"] = args.id
    for flag, field in (
        ("outbox", "outbox"),
        ("cron", "cron"),
        ("every", "interval_seconds"),
        ("timezone", "timezone"),
        ("note", "note"),
        ("overlap", "overlap"),
        ("catchup_window", "catchup_window_seconds"),
    ):
        if getattr(args, flag) is not None:
            body[field] = getattr(args, flag)
    if args.paused:
        body["paused"] = True
    if args.item:
        body.setdefault("items", []).extend(_schedule_item(item) for item in args.item)
    return body


def _schedule_item(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CliError(f"--item is not JSON: {err}") from err


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


def _add_outbox(command: argparse.ArgumentParser, help_text: str = "the outbox's name") -> None:
    """The OUTBOX positional that most commands start with."""
    command.add_argument("outbox", help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--api",
        default=os.environ.get("OUTBOX_API_URL", "http://127.0.0.1:8000"),
        help="the API's base URL (default: $OUTBOX_API_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("API_TOKEN", "").split(",")[0] or None,
        help="bearer token sent to the API (default: the first of $API_TOKEN's comma-separated"
        " tokens; none when it is unset)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    command = commands.add_parser("enqueue", help="enqueue one item, or a JSONL file in batches")
    _add_outbox(command, "the outbox's name (an outbox needs no setup: any valid name will do)")
    command.add_argument(
        "--destination", help="the destination to deliver to, by name (needed with --payload)"
    )
    command.add_argument("--payload", help="the item's JSON payload")
    command.add_argument("--key", help="Idempotency-Key (generated when absent)")
    command.add_argument("--not-before", help="RFC 3339 time with zone")
    command.add_argument("--delay-seconds", type=float, help="or: due this many seconds from now")
    command.add_argument(
        "--ordering-key", help="deliver after the outbox's earlier items with this key (a lane)"
    )
    command.add_argument(
        "--file", help="JSONL: one {destination, payload, idempotency_key?} per line"
    )
    command.set_defaults(run=enqueue)

    for name, run, help_text in (
        ("status", status, "an item's status"),
        ("cancel", cancel, "cancel a queued item"),
    ):
        command = commands.add_parser(name, help=help_text)
        _add_outbox(command)
        command.add_argument("key", help="the item's key (its Idempotency-Key)")
        command.set_defaults(run=run)

    command = commands.add_parser("redrive", help="redrive a failed item, or all failed ones")
    _add_outbox(command)
    command.add_argument("key", nargs="?", help="the failed item's key (or --all-failed)")
    command.add_argument(
        "--all-failed",
        action="store_true",
        help="redrive every failed item of the outbox instead of one",
    )
    command.add_argument("--destination", help="with --all-failed: only this destination")
    command.set_defaults(run=redrive)

    command = commands.add_parser(
        "purge", help="cancel every item not yet submitted (a batch, followed to its end)"
    )
    _add_outbox(command)
    command.add_argument("--destination", help="only this destination's items")
    command.add_argument("--reason", help="recorded on each cancelled item")
    command.add_argument(
        "--no-wait", action="store_true", help="answer with the batch at once, not at its end"
    )
    command.set_defaults(run=purge)

    command = commands.add_parser(
        "destinations", help="rates in force; pause, resume or re-rate one destination"
    )
    command.add_argument("name", nargs="?", help="one destination (all without it)")
    switch = command.add_mutually_exclusive_group()
    switch.add_argument("--pause", action="store_true", help="stop every new submit and poll")
    switch.add_argument(
        "--resume", action="store_true", help="undo --pause: submits and polls start again"
    )
    command.add_argument("--submit-rate", type=float, help="submits per second, at once")
    command.add_argument("--poll-rate", type=float, help="polls per second, at once")
    command.add_argument("--reason", help="why (shown while paused)")
    command.set_defaults(run=destinations)

    command = commands.add_parser(
        "lanes", help="an outbox's ordering lanes; resume a halted one (redrive or skip its head)"
    )
    _add_outbox(command)
    command.add_argument("ordering_key", nargs="?", help="one lane (all without it)")
    command.add_argument("--status", choices=["running", "idle", "halted"], help="filter the list")
    resume = command.add_mutually_exclusive_group()
    resume.add_argument("--redrive", action="store_true", help="run the failed head item again")
    resume.add_argument("--skip", action="store_true", help="move past the failed head item")
    command.add_argument("--reason", help="with --skip: recorded in the lane's log")
    command.set_defaults(run=lanes)

    command = commands.add_parser(
        "dead-letters",
        help="an outbox's failed items: list, discard one, or redrive all a filter selects",
    )
    _add_outbox(command)
    command.add_argument("--destination", help="only this destination's")
    command.add_argument("--error-code", help="only failures with the provider's code")
    command.add_argument("--failed-from", help="failed at or after (RFC 3339, with offset)")
    command.add_argument("--failed-to", help="failed before (RFC 3339, with offset)")
    command.add_argument("--all", action="store_true", help="list discarded ones too")
    act = command.add_mutually_exclusive_group()
    act.add_argument("--discard", metavar="KEY", help="give up on one (kept for audit)")
    act.add_argument(
        "--redrive-all", action="store_true", help="redrive every one selected, as a batch"
    )
    act.add_argument("--batch", metavar="ID", help="show a redrive batch's progress")
    command.add_argument("--wait", action="store_true", help="with --redrive-all: until done")
    command.add_argument("--reason", help="with --discard: why")
    command.set_defaults(run=dead_letters)

    command = commands.add_parser(
        "schedules", help="scheduled fan-out: enqueue a templated batch on a cron or interval"
    )
    actions = command.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every scheduled fan-out")
    create = actions.add_parser(
        "create", help="create one (flags, or --file with the API's JSON body, or both)"
    )
    create.add_argument(
        "id",
        help="the new schedule's id: letters, digits, '.', '_', '-' (its Temporal schedule is"
        " schedule/ID)",
    )
    create.add_argument("--file", help="JSON: the POST /v1/schedules body; flags override it")
    create.add_argument(
        "--outbox", help="the outbox each fire enqueues into (required, here or in --file)"
    )
    when = create.add_mutually_exclusive_group()
    when.add_argument("--cron", help="cron expression, e.g. '0 6 * * MON-FRI'")
    when.add_argument("--every", type=int, help="or: fire every this many seconds")
    create.add_argument("--timezone", help="IANA time zone the cron is read in (default UTC)")
    create.add_argument(
        "--item",
        action="append",
        help="JSON {destination, payload, key_suffix?, ordering_key?, max_attempts?}; repeat it",
    )
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument("--note", help="shown with the schedule")
    create.add_argument(
        "--overlap",
        choices=["skip", "buffer_one"],
        help="while a fire is still enqueueing: skip the next one (the API's default), or"
        " buffer one to fire as soon as the running one ends",
    )
    create.add_argument("--catchup-window", type=int, help="seconds (default 300)")
    for name, help_text in (
        ("show", "one schedule: spec, template, next and recent fires"),
        ("pause", "stop firing"),
        ("unpause", "fire again"),
        ("trigger", "fire now"),
        ("delete", "delete it (enqueued items stay)"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("id", help="the schedule's id")
        if name in ("pause", "unpause"):
            action.add_argument("--note", help="why (shown with the schedule)")
    command.set_defaults(run=schedules)

    command = commands.add_parser("tail", help="follow an outbox's events live")
    _add_outbox(command)
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
