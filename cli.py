"""`outbox`: the command line for the REST API (and `outbox dev` for the whole local stack).

    outbox enqueue demo --destination fake-webhook --payload '{"hello": "world"}' --key k1
    outbox enqueue demo --file items.jsonl          # one JSON item per line, sent in batches
    outbox status demo k1
    outbox items list demo [--status S] [--destination D] [--key-prefix P] [--limit N | --all]
    outbox tail demo [--since ID]                   # follow the outbox live
    outbox purge demo [--destination D] [--no-wait] # cancel all not yet submitted (a batch)
    outbox erase demo --subject ada@example.com     # erase an ended item's data, by filter
    outbox enqueue demo ... --ordering-key acct-7   # in order after acct-7's earlier items
    outbox lanes demo [KEY] [--status halted] [--redrive | --skip --reason R]
    outbox replays start demo --target fake-webhook [--status sent] [--key-prefix inv-]
                         [--created-from T] [--created-to T] [--confirm-count N] [--wait]
    outbox replays show demo ID
    outbox schedules create daily --outbox demo --cron '0 6 * * *' --item '{"destination": ...}'
    outbox schedules list | show ID | pause ID [--note N] | unpause ID | trigger ID | delete ID
    outbox destinations [NAME] [--pause --reason R | --resume | --enable | --disable]
                        [--submit-rate N]
    outbox destinations NAME --flow breaker=false --flow max_in_flight=5  # flow rules
    outbox cancel demo k1 | outbox redrive demo k1 | outbox redrive demo --all-failed
    outbox aggregates command flight BA1 assign_seat '{"seat": "1A", "passenger_id": "p1"}'
    outbox aggregates state flight BA1 | outbox aggregates events flight BA1 [--all]
    outbox payload-keys [reseal [--no-wait]]         # values per key; reseal under the newest
    outbox dev                                      # what `make dev` runs

`--api` (or OUTBOX_API_URL) picks the API, by default the running `make dev` stack's (on its
DEV_API_PORT); API_TOKEN, when set, is sent as a bearer token.
`--output table` prints a table, `--output json` the API's JSON; without it, a table on a
terminal and JSON in a pipe or file (`tail` prints one line per event unless `--output json`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import quote

import httpx
from durable_outbox_temporal.contract.item import DeliveryOutcome, ItemStatus

from configuration.api_address import default_api_url
from configuration.tls import shared_tls_context
from configuration.version import VERSION

BATCH_SIZE = 100


class ExitCode(IntEnum):
    """How `outbox` ends; scripts may branch on it (`EXIT_CODES` says what each means)."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    UNAVAILABLE = 5
    UNAUTHORIZED = 6
    INVALID_INPUT = 7
    # What a shell reports for a process killed by SIGPIPE, as `cat` or `yes` would be.
    PIPE_CLOSED = 141


EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.FAILURE: "any other failure: an HTTP 500, a purge batch that failed, a bug",
    ExitCode.USAGE: "the command line is wrong: an unknown option, a missing argument",
    ExitCode.NOT_FOUND: "HTTP 404: no such item, destination, lane, aggregate, command, schedule",
    ExitCode.CONFLICT: "HTTP 409 or 412: refused by the state it met (an Idempotency-Key reused"
    " with another payload, a seat taken, an item no longer cancellable)",
    ExitCode.UNAVAILABLE: "HTTP 429, 502, 503 or 504, or the API unreachable or silent past the"
    " timeout: try again later",
    ExitCode.UNAUTHORIZED: "HTTP 401 or 403: no token, a wrong one, or one without the scope",
    ExitCode.INVALID_INPUT: "HTTP 400, 413, 415 or 422, or JSON the CLI cannot read; a JSONL"
    " file with bad lines ends so after its good lines are sent",
    ExitCode.PIPE_CLOSED: "the reader closed the pipe early (`outbox items list | head -1`)",
}

_STATUS_EXIT_CODES = {
    400: ExitCode.INVALID_INPUT,
    401: ExitCode.UNAUTHORIZED,
    403: ExitCode.UNAUTHORIZED,
    404: ExitCode.NOT_FOUND,
    409: ExitCode.CONFLICT,
    412: ExitCode.CONFLICT,
    413: ExitCode.INVALID_INPUT,
    415: ExitCode.INVALID_INPUT,
    422: ExitCode.INVALID_INPUT,
    429: ExitCode.UNAVAILABLE,
    502: ExitCode.UNAVAILABLE,
    503: ExitCode.UNAVAILABLE,
    504: ExitCode.UNAVAILABLE,
}

OUTPUTS = ("json", "table")
# The columns an item list shows as a table (the JSON has every field).
ITEM_COLUMNS = ("key", "status", "destination", "attempts", "created_at", "updated_at")
EVENT_COLUMNS = ("seq", "type", "recorded_at", "actor", "command_id", "data")
DESTINATION_COLUMNS = ("name", "provider", "state", "submit", "poll", "reason")
# A table cell longer than this is cut (the JSON output has it whole).
CELL_WIDTH = 60


def exit_code_for(status: int) -> ExitCode:
    """The exit code an HTTP error status stands for."""
    return _STATUS_EXIT_CODES.get(status, ExitCode.FAILURE)


class CliError(Exception):
    """A failure to report as one line on stderr, exiting with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.code = code


def _client(args: argparse.Namespace) -> httpx.Client:
    # Every state-changing route takes JSON (a 415 otherwise), body or no body.
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    return httpx.Client(base_url=args.api, headers=headers, timeout=30, verify=shared_tls_context())


def _check(response: httpx.Response) -> Any:
    """The answer's JSON; a `CliError` with the problem's title and detail otherwise."""
    if response.is_success:
        return response.json()
    raise CliError(_problem_text(response), exit_code_for(response.status_code))


def _problem_text(response: httpx.Response) -> str:
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):  # not problem+json: a proxy's page, say
        return f"HTTP {response.status_code}: {response.text[:200] or response.reason_phrase}"
    # A validation problem's detail already names each invalid field.
    return (
        f"HTTP {response.status_code}: {problem.get('title', 'error')}: {problem.get('detail', '')}"
    )


def _items_path(outbox: str, key: str | None = None) -> str:
    path = f"/v1/outboxes/{quote(outbox, safe='')}/items"
    return path if key is None else f"{path}/{quote(key, safe='')}"


def _print(args: argparse.Namespace, value: Any, columns: Sequence[str] | None = None) -> None:
    """The API's answer as JSON (what scripts read), or as a table for a person."""
    if _output(args) == "json":
        print(json.dumps(value, indent=2, sort_keys=True))
    else:
        print(render_table(value, columns))


def _output(args: argparse.Namespace) -> str:
    chosen: str | None = args.output
    return chosen or ("table" if sys.stdout.isatty() else "json")


def render_table(value: Any, columns: Sequence[str] | None = None) -> str:
    """A list as rows under a header; an object holding one list (a page) as that list's rows
    and its other members below; any other object as one `field  value` line per member."""
    if isinstance(value, list):
        return _grid(value, columns)
    if not isinstance(value, dict):
        return _cell(value, width=None)
    lists = [name for name, member in value.items() if isinstance(member, list)]
    others = {name: member for name, member in value.items() if name not in lists}
    if len(lists) == 1 and not any(isinstance(m, dict | list) for m in others.values()):
        rows = value[lists[0]]
        if all(isinstance(row, dict) for row in rows):
            trailer = [f"{name}: {_cell(member, width=None)}" for name, member in others.items()]
            return "\n".join([_grid(rows, columns), *trailer])
    return _fields(value)


def _grid(rows: list[Any], columns: Sequence[str] | None) -> str:
    if not rows:
        return "(none)"
    records = [row if isinstance(row, dict) else {"value": row} for row in rows]
    names = list(columns or _scalar_members(records[0]))
    cells = [[_cell(record.get(name)) for name in names] for record in records]
    widths = [max(len(name), *(len(row[i]) for row in cells)) for i, name in enumerate(names)]
    lines = [[name.upper() for name in names], *cells]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _scalar_members(record: dict[str, Any]) -> list[str]:
    return [name for name, member in record.items() if not isinstance(member, dict | list)]


def _fields(value: dict[str, Any]) -> str:
    if not value:
        return "(none)"
    width = max(len(name) for name in value)
    return "\n".join(
        f"{name.ljust(width)}  {_member(name, member)}" for name, member in value.items()
    )


def _member(name: str, member: Any) -> str:
    """One member of an object: an item's `waiting_on` in words ("what holds it, until
    when"), anything else as its JSON."""
    if name == "waiting_on" and isinstance(member, list) and member:
        return "; ".join(
            f"{reason.get('detail') or reason.get('reason')}"
            + (f" (until {reason['until']})" if reason.get("until") else "")
            for reason in member
            if isinstance(reason, dict)
        )
    return _cell(member, width=None)


def _cell(value: Any, width: int | None = CELL_WIDTH) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split("\n"))
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def enqueue(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.file:
            _enqueue_file(client, args.outbox, Path(args.file))
            return
        if not args.destination or args.payload is None:
            raise CliError("enqueue needs --destination and --payload (or --file)", ExitCode.USAGE)
        body: dict[str, Any] = {
            "destination": args.destination,
            "payload": _json(args.payload, "--payload"),
        }
        if args.not_before:
            body["not_before"] = args.not_before
        if args.delay_seconds is not None:
            body["delay_seconds"] = args.delay_seconds
        if args.ordering_key:
            body["ordering_key"] = args.ordering_key
        if args.subject:
            body["subject"] = args.subject
        headers = {"Idempotency-Key": args.key} if args.key else {}
        _print(args, _check(client.post(_items_path(args.outbox), json=body, headers=headers)))


def _enqueue_file(client: httpx.Client, outbox: str, path: Path) -> None:
    """Send the file's good lines in batches and report each bad line (unreadable here or
    refused by the API) by its number; then exit 7 if any was bad (5 if the API only said to
    retry later)."""
    items, bad_lines = _read_jsonl(path)
    for number, reason in bad_lines:
        print(f"line {number}: {reason}", file=sys.stderr)
    created = existing = 0
    failures = [ExitCode.INVALID_INPUT for _ in bad_lines]
    for start in range(0, len(items), BATCH_SIZE):
        batch = items[start : start + BATCH_SIZE]
        body = {"items": [item for _, item in batch]}
        try:
            result = _check(client.post(f"{_items_path(outbox)}:batch", json=body))
        except (CliError, httpx.TransportError):
            # Earlier batches were sent (keyed lines are safe to send again).
            print(f"\nnot sent: line {batch[0][0]} and after", file=sys.stderr)
            raise
        created, existing = created + result["created"], existing + result["existing"]
        for entry in result["results"]:
            if entry["problem"]:
                number = batch[entry["index"]][0]
                print(f"line {number}: {entry['problem']['detail']}", file=sys.stderr)
                failures.append(exit_code_for(entry["status"]))
        _progress(start + len(batch), len(items))
    print(f"\ncreated {created}, existing {existing}, failed {len(failures)}", file=sys.stderr)
    if failures:
        # A line the API refused for what it says (4xx) is a bad line as much as broken JSON.
        bad = [code for code in failures if code != ExitCode.UNAVAILABLE]
        raise SystemExit(ExitCode.INVALID_INPUT if bad else ExitCode.UNAVAILABLE)


def _read_jsonl(path: Path) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """The file's items with their line numbers, and its bad lines with why (blank lines are
    skipped)."""
    items: list[tuple[int, Any]] = []
    bad_lines: list[tuple[int, str]] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as err:
                    bad_lines.append((number, f"not JSON: {err}"))
                    continue
                if isinstance(item, dict):
                    items.append((number, item))
                else:
                    bad_lines.append((number, "not a JSON object"))
    except (OSError, UnicodeDecodeError) as err:
        raise CliError(f"{path}: {err}", ExitCode.INVALID_INPUT) from err
    return items, bad_lines


def _progress(done: int, total: int, width: int = 30) -> None:
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


def status(args: argparse.Namespace) -> None:
    with _client(args) as client:
        _print(args, _check(client.get(_items_path(args.outbox, args.key))))


def cancel(args: argparse.Namespace) -> None:
    with _client(args) as client:
        _print(args, _check(client.post(f"{_items_path(args.outbox, args.key)}/cancel", json={})))


def redrive(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.all_failed:
            url = f"{_items_path(args.outbox)}:redrive-failed"
            _print(args, _check(client.post(url, json={"destination": args.destination})))
        elif args.key:
            _print(args, _check(client.post(f"{_items_path(args.outbox, args.key)}/redrive")))
        else:
            raise CliError("redrive needs a KEY or --all-failed", ExitCode.USAGE)


def purge(args: argparse.Namespace) -> None:
    """Start a purge batch and follow it to its end (unless --no-wait); exit 1 if it failed."""
    with _client(args) as client:
        body: dict[str, Any] = {"destination": args.destination}
        if args.reason:
            body["reason"] = args.reason
        batch = _check(client.post(f"{_items_path(args.outbox)}:purge", json=body))
        if not args.no_wait:
            batch = _follow(client, batch, _purge_progress)
        _print(args, batch)
    if batch["state"] not in ("running", "completed"):
        print(f"purge {batch['state']}: {batch.get('failure')}", file=sys.stderr)
        raise SystemExit(ExitCode.FAILURE)


def erase(args: argparse.Namespace) -> None:
    """Start an erase batch and follow it to its end (unless --no-wait); exit 1 if it failed."""
    if (args.key_prefix is None) == (args.subject is None):
        raise CliError("erase needs --key-prefix or --subject, exactly one", ExitCode.USAGE)
    body = {"key_prefix": args.key_prefix} if args.subject is None else {"subject": args.subject}
    with _client(args) as client:
        batch = _check(client.post(f"{_items_path(args.outbox)}:erase", json=body))
        if not args.no_wait:
            batch = _follow(client, batch, _erase_progress)
        _print(args, batch)
    if batch["state"] not in ("running", "completed"):
        print(f"erase {batch['state']}: {batch.get('failure')}", file=sys.stderr)
        raise SystemExit(ExitCode.FAILURE)


def _erase_progress(batch: dict[str, Any]) -> str:
    return f"{batch['erased']} erased, {batch['skipped']} skipped, {batch['pages']} page(s)"


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


def payload_keys(args: argparse.Namespace) -> None:
    """The stored values under each payload key; with `reseal`, start a reseal batch and follow
    it to its end (unless --no-wait), exiting 1 if it failed."""
    with _client(args) as client:
        if args.action is None:
            _print(args, _check(client.get("/v1/sealed-values")))
            return
        batch = _check(client.post("/v1/sealed-values:reseal", json={}))
        if not args.no_wait:
            batch = _follow(client, batch, _reseal_progress)
        _print(args, batch)
    if batch["state"] not in ("running", "completed"):
        print(f"reseal {batch['state']}: {batch.get('failure')}", file=sys.stderr)
        raise SystemExit(ExitCode.FAILURE)


def _reseal_progress(batch: dict[str, Any]) -> str:
    return (
        f"{batch['resealed']} resealed under {batch['key_id']}, {batch['unreadable']} unreadable,"
        f" {batch['pages']} page(s)"
    )


def destinations(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.name is None:
            if args.flow:
                raise CliError("--flow needs the destination's NAME", ExitCode.USAGE)
            listed = _check(client.get("/v1/destinations"))
            if _output(args) == "json":
                _print(args, listed)
            else:
                _print(args, [_destination_row(d) for d in listed], DESTINATION_COLUMNS)
            return
        url = f"/v1/destinations/{quote(args.name, safe='')}"
        change: dict[str, Any] = {}
        if args.flow:
            change["flow"] = dict(_flow_change(text) for text in args.flow)
        if args.pause or args.resume:
            change["paused"] = bool(args.pause)
        if args.enable or args.disable:
            change["enabled"] = bool(args.enable)
        if args.submit_rate is not None:
            change["submit_rate"] = args.submit_rate
        if args.poll_rate is not None:
            change["poll_rate"] = args.poll_rate
        if args.reason is not None:
            change["reason"] = args.reason
        response = client.patch(url, json=change) if change else client.get(url)
        shown = _check(response)
        if _output(args) == "json":
            _print(args, shown)
        else:
            print(_destination_fields(shown))


def _flow_change(text: str) -> tuple[str, Any]:
    """`--flow FIELD=VALUE`: the value as JSON (`false`, `5`, `[...]`, `null`), else as text."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise CliError(f"--flow {text!r}: not FIELD=VALUE", ExitCode.USAGE)
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


def _destination_state(destination: dict[str, Any]) -> str:
    """A destination's state in words: what a person checks first."""
    if destination.get("disabled"):
        return f"disabled since {destination.get('disabled_since')}"
    if destination.get("circuit") == "open":
        return "circuit open"
    if destination.get("paused_until"):
        return f"paused until {destination['paused_until']}"
    if destination.get("paused"):
        return "paused"
    return "running"


def _rate(rate: dict[str, Any] | None) -> str:
    """A rate in force and who set it: `5.0/s` from the destinations file, `3.0/s (api)`."""
    if not rate:
        return ""
    shown = f"{rate['rate']}/s"
    return shown if rate.get("source") in (None, "worker") else f"{shown} ({rate['source']})"


def _destination_row(destination: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": destination["name"],
        "provider": destination["provider"],
        "state": _destination_state(destination),
        "submit": _rate(destination.get("submit")),
        "poll": _rate(destination.get("poll")),
        "reason": destination.get("pause_reason"),
    }


def _destination_fields(destination: dict[str, Any]) -> str:
    """One destination for a person: its state and rates, then each flow-control rule in
    force with where its value comes from (the destinations file or a PATCH, and when)."""
    lines = {**_destination_row(destination)}
    if destination.get("in_flight") is not None:
        cap = ((destination.get("flow_policy") or {}).get("max_in_flight") or {}).get("value")
        lines["in_flight"] = f"{destination['in_flight']} of {cap} out now"
    flow = destination.get("flow") or {}
    for name in ("storms", "opened_at", "next_probe_at", "probes_failed", "last_error"):
        if flow.get(name) not in (None, 0, ""):
            lines[f"flow.{name}"] = flow[name]
    adaptive = flow.get("adaptive")
    if adaptive:
        held = " (a hand rate holds)" if adaptive.get("released") else ""
        lines["adaptive"] = (
            f"{adaptive['rate']:g}/s between {adaptive['floor']:g} and {adaptive['ceiling']:g}"
            f"{held}"
        )
        recent = adaptive.get("history") or []
        if recent:
            lines["adaptive.recent"] = ", ".join(f"{point['rate']:g}" for point in recent[-10:])
    shown = _fields(lines)
    policy = destination.get("flow_policy") or {}
    if not policy:
        return shown
    width = max(len(name) for name in policy)
    rules = [
        f"  {name.ljust(width)}  {_cell(field['value'], width=None) or '-'}"
        + (f"  (set by the API at {field['changed_at']})" if field.get("source") == "api" else "")
        for name, field in policy.items()
    ]
    return "\n".join([shown, "flow policy in force:", *rules])


def lanes(args: argparse.Namespace) -> None:
    path = f"/v1/outboxes/{quote(args.outbox, safe='')}/lanes"
    with _client(args) as client:
        if args.ordering_key is None:
            if args.redrive or args.skip:
                raise CliError("--redrive and --skip need the lane's ORDERING_KEY", ExitCode.USAGE)
            params = {"status": args.status} if args.status else {}
            _print(args, _check(client.get(path, params=params)))
            return
        lane = f"{path}/{quote(args.ordering_key, safe='')}"
        if args.redrive:
            _print(args, _check(client.post(f"{lane}/redrive")))
        elif args.skip:
            body = {"reason": args.reason} if args.reason else {}
            _print(args, _check(client.post(f"{lane}/skip", json=body)))
        else:
            _print(args, _check(client.get(lane)))


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
            _print(
                args, _check(client.post(url, json={"reason": args.reason} if args.reason else {}))
            )
        elif args.redrive_all:
            batch = _check(client.post(f"{path}/dead-letters:redrive", json=which))
            if args.wait:
                batch = _follow(client, batch, _redrive_progress)
            _print(args, batch)
        elif args.batch:
            _print(args, _check(client.get(f"{path}/redrive-batches/{quote(args.batch, safe='')}")))
        else:
            params = {**which, "include_discarded": "true"} if args.all else which
            _print(args, _check(client.get(f"{path}/dead-letters", params=params)))


def _replay_progress(replay: dict[str, Any]) -> str:
    skipped = replay["erased"] + replay["pruned"]
    return (
        f"{replay['replayed']} replayed, {replay['already']} already, {skipped} without payload,"
        f" {replay['pages']} page(s)"
    )


def replays(args: argparse.Namespace) -> None:
    path = f"/v1/outboxes/{quote(args.outbox, safe='')}/replays"
    with _client(args) as client:
        if args.action == "show":
            _print(args, _check(client.get(f"{path}/{quote(args.id, safe='')}")))
            return
        body = {
            "target": args.target,
            "destination": args.destination,
            "statuses": args.status,
            "created_from": args.created_from,
            "created_to": args.created_to,
            "key_prefix": args.key_prefix,
            "confirm_count": args.confirm_count,
        }
        replay = _check(
            client.post(path, json={name: v for name, v in body.items() if v is not None})
        )
        if args.wait:
            replay = _follow(client, replay, _replay_progress)
        _print(args, replay)


def schedules(args: argparse.Namespace) -> None:
    path = "/v1/schedules"
    with _client(args) as client:
        if args.action == "list":
            _print(args, _check(client.get(path)))
            return
        if args.action == "create":
            _print(args, _check(client.post(path, json=_schedule_body(args))))
            return
        schedule = f"{path}/{quote(args.id, safe='')}"
        if args.action == "show":
            _print(args, _check(client.get(schedule)))
        elif args.action in ("pause", "unpause"):
            body = {"note": args.note} if args.note else {}
            _print(args, _check(client.post(f"{schedule}/{args.action}", json=body)))
        elif args.action == "trigger":
            _print(args, _check(client.post(f"{schedule}/trigger")))
        else:
            response = client.delete(schedule)
            if not response.is_success:
                _check(response)
            _print(args, {"id": args.id, "deleted": True})


def _schedule_body(args: argparse.Namespace) -> dict[str, Any]:
    """The create body: `--file` (the API's JSON body), then each flag given on top of it."""
    body: dict[str, Any] = {}
    if args.file:
        try:
            body = json.loads(Path(args.file).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CliError(f"{args.file}: {err}", ExitCode.INVALID_INPUT) from err
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
    return _json(text, "--item")


def items_list(args: argparse.Namespace) -> None:
    """A page of the outbox's items, newest first (every page with --all)."""
    params = {
        name: value
        for name, value in (
            ("status", args.status),
            ("destination", args.destination),
            ("key_prefix", args.key_prefix),
            ("error_code", args.error_code),
            ("delivery", args.delivery),
            ("created_from", args.created_from),
            ("created_to", args.created_to),
            ("limit", args.limit),
            ("cursor", args.cursor),
        )
        if value is not None
    }
    with _client(args) as client:
        page = _check(client.get(_items_path(args.outbox), params=params))
        items = page["items"]
        while args.all and page["next_cursor"]:
            params["cursor"] = page["next_cursor"]
            page = _check(client.get(_items_path(args.outbox), params=params))
            items += page["items"]
    if args.key_prefix is not None:
        # Also filtered here: an API that predates `key_prefix` ignores it.
        items = [item for item in items if item["key"].startswith(args.key_prefix)]
    _print(args, {"items": items, "next_cursor": page["next_cursor"]}, ITEM_COLUMNS)
    if page["next_cursor"] and _output(args) == "table":
        print(f"more: --cursor {page['next_cursor']} (or --all)", file=sys.stderr)


def aggregates(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.action == "types":
            _print(args, _check(client.get("/v1/aggregates")), ("type", "events"))
            return
        if args.action == "list":
            _print(args, _aggregate_ids(client, args))
            return
        path = f"/v1/aggregates/{quote(args.type, safe='')}/{quote(args.id, safe='')}"
        if args.action == "command":
            payload = _json(args.payload, "the command's payload")
            if not isinstance(payload, dict):
                raise CliError(
                    "the command's payload must be a JSON object", ExitCode.INVALID_INPUT
                )
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
            params = (
                {"expected_version": args.expected_version}
                if args.expected_version is not None
                else {}
            )
            url = f"{path}/commands/{quote(args.command, safe='')}"
            result = _check(client.post(url, json=payload, headers=headers, params=params))
            _print(args, result, EVENT_COLUMNS)
            return
        reader = {"actor": args.actor} if args.actor else {}
        if args.action == "state":
            _print(args, _check(client.get(path, params=reader)))
        else:
            _print(args, _aggregate_events(client, path, args, reader), EVENT_COLUMNS)


def _aggregate_ids(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    path = f"/v1/aggregates/{quote(args.type, safe='')}"
    params: dict[str, Any] = {"limit": args.limit} if args.limit is not None else {}
    if args.after is not None:
        params["after"] = args.after
    page = _check(client.get(path, params=params))
    ids = page["items"]
    while args.all and page["next_after"]:
        params["after"] = page["next_after"]
        page = _check(client.get(path, params=params))
        ids += page["items"]
    return {"items": ids, "next_after": page["next_after"]}


def _aggregate_events(
    client: httpx.Client, path: str, args: argparse.Namespace, reader: dict[str, str]
) -> list[Any]:
    """Oldest first after `--after`; with --all, page on until an empty page."""
    params: dict[str, Any] = {**reader, "after": args.after}
    if args.limit is not None:
        params["limit"] = args.limit
    events: list[Any] = _check(client.get(f"{path}/events", params=params))
    page = events
    while args.all and page:
        params["after"] = page[-1]["seq"]
        page = _check(client.get(f"{path}/events", params=params))
        events += page
    return events


def tail(args: argparse.Namespace) -> None:
    """Each event as one line (`--output json`: one JSON object a line), as it happens."""
    from websockets.exceptions import ConnectionClosedError, InvalidStatus
    from websockets.sync.client import connect

    url = args.api.replace("http", "ws", 1) + f"/v1/outboxes/{quote(args.outbox, safe='')}/live"
    query = [f"since={args.since}"] if args.since is not None else []
    if args.token:
        query.append(f"token={quote(args.token)}")
    if query:
        url += "?" + "&".join(query)
    try:
        with connect(url) as socket:
            for seen, message in enumerate(socket, start=1):
                print(_tail_line(args, json.loads(message)), flush=True)
                if args.count is not None and seen >= args.count:
                    return
    except InvalidStatus as err:
        status = err.response.status_code
        raise CliError(f"HTTP {status}: the live stream refused", exit_code_for(status)) from err
    except ConnectionClosedError as err:
        refused = err.rcvd is not None and err.rcvd.code == 1008  # policy violation: our request
        code = ExitCode.INVALID_INPUT if refused else ExitCode.UNAVAILABLE
        raise CliError(f"the live stream closed: {err}", code) from err
    except OSError as err:
        if isinstance(err, BrokenPipeError):
            raise
        raise CliError(f"cannot reach the API at {args.api}: {err}", ExitCode.UNAVAILABLE) from err


def _tail_line(args: argparse.Namespace, event: dict[str, Any]) -> str:
    if args.output == "json":
        return json.dumps(event, sort_keys=True)
    detail = f"  {event['detail']}" if event.get("detail") else ""
    transition = f"{event['type']} -> {event['status']}"
    return f"{event['at']}  #{event['id']}  {event['key']}  {transition}{detail}"


def dev(args: argparse.Namespace) -> None:
    from devstack.dev import main as run_dev_stack

    raise SystemExit(run_dev_stack())


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CliError(f"{what} is not JSON: {err}", ExitCode.INVALID_INPUT) from err


def _add_outbox(command: argparse.ArgumentParser, help_text: str = "the outbox's name") -> None:
    """The OUTBOX positional that most commands start with."""
    command.add_argument("outbox", help=help_text)


def _exit_codes_text() -> str:
    return "exit codes:\n" + "\n".join(
        textwrap.fill(
            meaning, width=90, initial_indent=f"  {int(code):>3}  ", subsequent_indent=" " * 7
        )
        for code, meaning in EXIT_CODES.items()
    )


# What `add_subparsers` answers: the commands (or a group's actions) a parser chooses among.
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser() -> argparse.ArgumentParser:
    """The `outbox` parser: the global options, then each command or group of commands."""
    parser = _global_options()
    commands = parser.add_subparsers(dest="command", required=True)
    leaves = [
        _add_enqueue_command(commands),
        *_add_enqueued_item_commands(commands),
        _add_destinations_command(commands),
        _add_lanes_command(commands),
        _add_dead_letters_command(commands),
        *_add_replays_commands(commands),
        *_add_schedules_commands(commands),
        *_add_items_commands(commands),
        *_add_aggregates_commands(commands),
        _add_tail_command(commands),
        _add_payload_keys_command(commands),
    ]
    # `dev` answers nothing to format, so it is no leaf: it takes no `--output`.
    commands.add_parser("dev", help="run the whole local stack (make dev)").set_defaults(run=dev)
    for leaf in leaves:
        # Not set unless given, so the option before the command still counts.
        leaf.add_argument(
            "--output", choices=OUTPUTS, default=argparse.SUPPRESS, help="as `outbox --output`"
        )
    return parser


def _global_options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox",
        description=__doc__,
        epilog=_exit_codes_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    parser.add_argument(
        "--output",
        choices=OUTPUTS,
        help="json (the API's answer, what scripts read) or table; by default a table on a"
        " terminal, else json (also accepted after the command)",
    )
    parser.add_argument(
        "--api",
        # Resolved in `main`, not here: the reference page generated from this parser stays the
        # same whatever stack runs beside it.
        help="the API's base URL (default: $OUTBOX_API_URL, else the API of the running `make"
        " dev` stack, else http://127.0.0.1:$DEV_API_PORT, port 8000 when unset)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("API_TOKEN", "").split(",")[0] or None,
        help="bearer token sent to the API (default: the first of $API_TOKEN's comma-separated"
        " tokens; none when it is unset)",
    )
    return parser


def _add_enqueue_command(commands: _Commands) -> argparse.ArgumentParser:
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
        "--subject", help="whom the item is about (`outbox erase --subject` erases theirs)"
    )
    command.add_argument(
        "--file", help="JSONL: one {destination, payload, idempotency_key?} per line"
    )
    command.set_defaults(run=enqueue)
    return command


def _add_enqueued_item_commands(commands: _Commands) -> list[argparse.ArgumentParser]:
    """`status`, `cancel`, `redrive`, `purge` and `erase`: what is done to items once
    enqueued."""
    added = []
    for name, run, help_text in (
        ("status", status, "an item's status"),
        ("cancel", cancel, "cancel a queued item"),
    ):
        command = commands.add_parser(name, help=help_text)
        _add_outbox(command)
        command.add_argument("key", help="the item's key (its Idempotency-Key)")
        command.set_defaults(run=run)
        added.append(command)

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
    added.append(command)

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
    added.append(command)

    command = commands.add_parser(
        "erase",
        help="erase the data of every ended item with a key prefix or of a subject (a batch,"
        " followed to its end); items under way are skipped and counted",
    )
    _add_outbox(command)
    command.add_argument("--key-prefix", help="the items whose key starts with this")
    command.add_argument("--subject", help="the items enqueued with this subject")
    command.add_argument(
        "--no-wait", action="store_true", help="answer with the batch at once, not at its end"
    )
    command.set_defaults(run=erase)
    added.append(command)
    return added


def _add_destinations_command(commands: _Commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "destinations", help="rates in force; pause, resume or re-rate one destination"
    )
    command.add_argument("name", nargs="?", help="one destination (all without it)")
    switch = command.add_mutually_exclusive_group()
    switch.add_argument("--pause", action="store_true", help="stop every new submit and poll")
    switch.add_argument(
        "--resume", action="store_true", help="undo --pause: submits and polls start again"
    )
    switch.add_argument(
        "--enable",
        action="store_true",
        help="re-enable a destination disabled after failing too long: its submits resume",
    )
    switch.add_argument(
        "--disable", action="store_true", help="disable it by hand: its submits stay paused"
    )
    command.add_argument("--submit-rate", type=float, help="submits per second, at once")
    command.add_argument("--poll-rate", type=float, help="polls per second, at once")
    command.add_argument("--reason", help="why (shown while paused)")
    command.add_argument(
        "--flow",
        action="append",
        metavar="FIELD=VALUE",
        help="change a flow-control rule at run time, e.g. --flow breaker=false "
        "--flow max_in_flight=5 --flow max_in_flight=null (back to the file's); repeatable",
    )
    command.set_defaults(run=destinations)
    return command


def _add_lanes_command(commands: _Commands) -> argparse.ArgumentParser:
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
    return command


def _add_dead_letters_command(commands: _Commands) -> argparse.ArgumentParser:
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
    return command


def _add_replays_commands(commands: _Commands) -> list[argparse.ArgumentParser]:
    """`replays start | show`."""
    command = commands.add_parser(
        "replays", help="send items again, as new items, to the same or another destination"
    )
    actions = command.add_subparsers(dest="action", required=True)
    start = actions.add_parser("start", help="replay the items a filter selects, as a batch")
    _add_outbox(start)
    start.add_argument("--target", required=True, help="the destination the new items go to")
    start.add_argument("--destination", help="only items of this destination")
    start.add_argument(
        "--status", action="append", help="only items in this status; repeat it for more"
    )
    start.add_argument("--created-from", help="created at or after (RFC 3339, with offset)")
    start.add_argument("--created-to", help="created before (RFC 3339, with offset)")
    start.add_argument("--key-prefix", help="only keys starting with this")
    start.add_argument(
        "--confirm-count",
        type=int,
        help="how many the filter selects, past the API's REPLAY_CONFIRM_OVER",
    )
    start.add_argument("--wait", action="store_true", help="until it is done")
    show = actions.add_parser("show", help="a replay's progress")
    _add_outbox(show)
    show.add_argument("id", help="the replay's id")
    command.set_defaults(run=replays)
    return [start, show]


def _add_schedules_commands(commands: _Commands) -> list[argparse.ArgumentParser]:
    """`schedules list | create | show | pause | unpause | trigger | delete`."""
    command = commands.add_parser(
        "schedules", help="scheduled fan-out: enqueue a templated batch on a cron or interval"
    )
    actions = command.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every scheduled fan-out")
    _add_schedule_create(actions)
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
    return list(actions.choices.values())


def _add_schedule_create(actions: _Commands) -> None:
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


def _add_items_commands(commands: _Commands) -> list[argparse.ArgumentParser]:
    """`items list`."""
    command = commands.add_parser("items", help="list an outbox's items")
    item_actions = command.add_subparsers(dest="action", required=True)
    listing = item_actions.add_parser(
        "list", help="the outbox's items, newest first, filtered; a page, or --all of them"
    )
    _add_outbox(listing)
    listing.add_argument(
        "--status",
        choices=[status.value for status in ItemStatus],
        help="only items in this status",
    )
    listing.add_argument("--destination", help="only this destination's items")
    listing.add_argument("--key-prefix", help="only items whose key starts with this")
    listing.add_argument("--error-code", help="only items that failed with the provider's code")
    listing.add_argument(
        "--delivery",
        choices=[outcome.value for outcome in DeliveryOutcome],
        help="only items whose delivery reports say so",
    )
    listing.add_argument("--created-from", help="created at or after (RFC 3339)")
    listing.add_argument("--created-to", help="created before (RFC 3339)")
    listing.add_argument(
        "--limit", type=int, help="items per page (the API's default 50; with --all, per request)"
    )
    page = listing.add_mutually_exclusive_group()
    page.add_argument("--cursor", help="the page after this `next_cursor`")
    page.add_argument("--all", action="store_true", help="every page, not just the first")
    listing.set_defaults(run=items_list)
    return list(item_actions.choices.values())


def _add_aggregates_commands(commands: _Commands) -> list[argparse.ArgumentParser]:
    """`aggregates types | list | command | state | events`."""
    command = commands.add_parser(
        "aggregates", help="run an aggregate's commands; read its state and events"
    )
    aggregate_actions = command.add_subparsers(dest="action", required=True)
    aggregate_actions.add_parser("types", help="the aggregate types with their commands")
    listing = aggregate_actions.add_parser("list", help="a type's aggregates, by id")
    listing.add_argument("type", help="the aggregate type, e.g. flight")
    listing.add_argument("--after", help="ids after this one (the page's `next_after`)")
    listing.add_argument("--limit", type=int, help="ids per page (the API's default 50)")
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    _add_aggregate_command(aggregate_actions)
    for name, help_text in (
        ("state", "an aggregate's state, version, read models and effect counts"),
        ("events", "an aggregate's events, oldest first"),
    ):
        action = aggregate_actions.add_parser(name, help=help_text)
        action.add_argument("type", help="the aggregate type, e.g. flight")
        action.add_argument("id", help="the aggregate's id")
        action.add_argument("--actor", help="read as this actor (one the token may act as)")
        if name == "events":
            action.add_argument(
                "--after", type=int, default=0, help="only events with a greater seq"
            )
            action.add_argument("--limit", type=int, help="events per page (the API's 100)")
            action.add_argument("--all", action="store_true", help="every page, not just one")
    command.set_defaults(run=aggregates)
    return list(aggregate_actions.choices.values())


def _add_aggregate_command(aggregate_actions: _Commands) -> None:
    run_command = aggregate_actions.add_parser(
        "command", help="run a command (the first one creates the aggregate)"
    )
    run_command.add_argument("type", help="the aggregate type, e.g. flight")
    run_command.add_argument("id", help="the aggregate's id, e.g. BA117")
    run_command.add_argument("command", help="the command, e.g. assign_seat")
    run_command.add_argument(
        "payload", nargs="?", default="{}", help="the command's JSON object (default {})"
    )
    run_command.add_argument(
        "--idempotency-key",
        help="the command id: a repeat answers the first outcome and appends nothing",
    )
    run_command.add_argument(
        "--expected-version",
        type=int,
        help="refuse (409) unless the aggregate is at this version",
    )


def _add_tail_command(commands: _Commands) -> argparse.ArgumentParser:
    command = commands.add_parser("tail", help="follow an outbox's events live")
    _add_outbox(command)
    command.add_argument("--since", type=int, help="replay events after this id first")
    command.add_argument("--count", type=int, help="stop after this many events")
    command.set_defaults(run=tail)
    return command


def _add_payload_keys_command(commands: _Commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "payload-keys",
        help="stored values per payload key; `reseal` seals them all under the newest (a batch)",
    )
    command.add_argument(
        "action",
        nargs="?",
        choices=["reseal"],
        help="reseal: seal every stored value again under the newest key, so an old one can go",
    )
    command.add_argument(
        "--no-wait", action="store_true", help="answer with the batch at once, not at its end"
    )
    command.set_defaults(run=payload_keys)
    return command


def main(argv: list[str] | None = None) -> None:
    """Run one command; every failure ends as one line on stderr and an `ExitCode`."""
    args = build_parser().parse_args(argv)
    args.api = args.api or default_api_url(os.environ)
    try:
        args.run(args)
        sys.stdout.flush()  # here, so a closed pipe is met while we can still handle it
    except BrokenPipeError:
        _silence_stdout()
        raise SystemExit(ExitCode.PIPE_CLOSED) from None
    except CliError as err:
        _fail(str(err), err.code)
    except httpx.TimeoutException as err:
        _fail(f"the API at {args.api} did not answer in time: {err!r}", ExitCode.UNAVAILABLE)
    except httpx.TransportError as err:
        _fail(f"cannot reach the API at {args.api}: {err}", ExitCode.UNAVAILABLE)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as err:  # a bug or an answer we do not understand: still one line
        _fail(f"unexpected error: {type(err).__name__}: {err}", ExitCode.FAILURE)


def _fail(message: str, code: ExitCode) -> None:
    with contextlib.suppress(BrokenPipeError):
        print(f"outbox: {message}", file=sys.stderr)
    raise SystemExit(code) from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is left in its buffer
    does not fail again (and print a traceback) as it exits."""
    try:
        stdout = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file: nothing will flush it
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stdout)
    os.close(devnull)


if __name__ == "__main__":
    main()
