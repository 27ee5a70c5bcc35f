"""`make chaos`: upgrade from the previous release with work in flight, checked at the provider.

    python -m bench.upgrade                # from the newest release in CHANGELOG.md
    python -m bench.upgrade --from 0.1.0   # from an older one

The releases and their commits are the link definitions at the foot of CHANGELOG.md
(`[0.2.0]: ../../tree/<commit>`), which a release cut writes. The previous release (extracted
with `git archive`, its client packages imported from its own tree) runs its own worker and
API against a Temporal dev server (SQLite on disk), the fake provider (in this process, so its
counters are read directly) and a fresh PostgreSQL read model its own code migrates. Work is put
in flight through its API: items mid-poll, an ordering lane half delivered, a bulk shard mid-batch
(every request slow), a lock whose lease timer is pending, a labour whose announcement's
notifications (its effects' items) wait on a paused destination whose circuit is open, a debounce
window open, a schedule between fires, and dead letters. Then the old worker and API get SIGTERM,
HEAD's alembic migrates the read model, HEAD's worker and API take over, the destination is
resumed, and everything must finish: nothing lost, doubled (the fake's delivery counts) or out of
order (the lane at the fake), no non-determinism (the new worker's log, and every history scanned
for WorkflowTaskFailed), the dead letters and the aggregates' event stores as before.

In the releases so far an aggregate effect runs as soon as its event is recorded (one enqueue
activity), and no seed aggregate has both a timer and effects: the pending timer is the lock's,
and the planned effect's delivery is in flight rather than the effect activity itself.

Environment: UPGRADE_POSTGRES_URL (a database the run may create databases from; default the
local `test`), UPGRADE_KEEP=1 keeps the working directory (logs, the old tree). Writes
`.bench/upgrade.json`; exits 1 with the problems listed on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
import venv
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from durable_outbox_temporal.codec import new_key_setting
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.verdict import verdict
from configuration.settings import PROJECT_ROOT
from devstack.dev import Child, http_ok, start, stop
from devstack.fake_provider import (
    DEFAULT_ACS_ACCESS_KEY,
    DEFAULT_WEBHOOK_SECRET,
    FakeProvider,
    FaultConfig,
    Step,
    run_fake_provider,
)
from devstack.temporal_server import DevServer, find_binary
from readmodel.db import normalise_url

CHANGELOG = PROJECT_ROOT / "CHANGELOG.md"
# A release's link definition in the changelog: its version and the commit it was cut at.
RELEASE_LINK = re.compile(
    r"^\[(\d+\.\d+\.\d+)\]: \S*/(?:tree|commit)/([0-9a-f]{7,40})$", re.MULTILINE
)
REPORT_PATH = PROJECT_ROOT / ".bench" / "upgrade.json"
POSTGRES_URL = os.environ.get(
    "UPGRADE_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
OUTBOX = "upgrade"
LANE_ITEMS = 20
BULK_ITEMS = 100
# Every request to the bulk destination takes this long: its batches are out when the old
# worker stops.
BULK_LATENCY_MS = 5000
EMAIL_ITEMS = 4
BREAKER_ITEMS = 4
DEAD_ITEMS = 2
DEBOUNCE_ITEMS = 3
SCHEDULE_EVERY_S = 15
# Items not final this long after HEAD took over count as lost.
SETTLE_S = 300.0
WORKER_READY_LINE = "worker ready"
# The SDK core colours its log lines.
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
NONDETERMINISM = re.compile(
    r"nondetermin|workflow task failed|failing workflow task|failed activation", re.IGNORECASE
)

# Runs an old process on the old tree only: the editable installs of HEAD (their finders and
# `.pth` paths) are taken out, the old tree's own client packages (`clients/*/src`) come first,
# HEAD-only packages (named in argv[2]) refuse to import, and at exit the process names every
# module it loaded from outside the old tree and the virtualenv (none is expected).
GUARD = r"""
import atexit, glob, os, runpy, signal, sys
old_root = os.path.realpath(sys.argv[1])
head_only = set(filter(None, sys.argv[2].split(",")))
roots = (old_root, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix))
inside = lambda path: any(os.path.realpath(path).startswith(root + os.sep) for root in roots)
clients = sorted(glob.glob(os.path.join(old_root, "clients", "*", "src")))
sys.path[:] = [old_root, *clients] + [p for p in sys.path if p and inside(p)]
editable = lambda hook: "__editable__" in getattr(hook, "__module__", "")
sys.meta_path[:] = [finder for finder in sys.meta_path if not editable(finder)]
sys.path_hooks[:] = [hook for hook in sys.path_hooks if not editable(hook)]
sys.path_importer_cache.clear()
class HeadOnly:
    def find_spec(self, name, path=None, target=None):
        # Top-level packages only HEAD has: importing one would run HEAD's code.
        if name.partition(".")[0] in head_only:
            raise ImportError(f"upgrade-guard: {name} is HEAD's, not the old release's")
sys.meta_path.insert(0, HeadOnly())
def report():
    foreign = sorted(
        name for name, module in list(sys.modules.items())
        if getattr(module, "__file__", None) and not inside(module.__file__)
    )
    print("upgrade-guard:", "leaked " + ", ".join(foreign) if foreign else "clean", flush=True)
atexit.register(report)
# uvicorn re-raises the SIGTERM it caught once it has shut down, which skips atexit.
raise_signal = signal.raise_signal
signal.raise_signal = lambda signum: (report(), raise_signal(signum))
os.chdir(old_root)
target, sys.argv = sys.argv[3], sys.argv[3:]
if target == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
"""


class UpgradeFailure(RuntimeError):
    """A step of the run could not be done (not a finding about the upgrade itself)."""


@dataclass
class Run:
    """What the run learns on the way, judged at the end."""

    api: str
    fake: FakeProvider
    client: Client
    timings: dict[str, float] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    findings: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # When HEAD took over: wall clock (the fake's delivery log) and monotonic (its requests).
    switched_at: float = 0.0
    switched_mono: float = 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Release:
    """A release to upgrade from: its version and the commit it was cut at."""

    version: str
    commit: str


def releases(changelog: Path = CHANGELOG) -> dict[str, Release]:
    """Every release the changelog links to a commit, oldest first."""
    found = {
        version: Release(version, commit)
        for version, commit in RELEASE_LINK.findall(changelog.read_text())
    }
    return dict(sorted(found.items(), key=lambda item: _semver(item[0])))


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def extract_release(release: Release, into: Path) -> Path:
    """A release's tree, from git (no checkout is touched)."""
    tree = into / f"durable-outbox-{release.version}"
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "archive", release.commit],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def client_packages(root: Path) -> dict[str, set[str]]:
    """The client packages a tree carries (`clients/*`): distribution name -> its importable
    top-level packages. The old release imports its own from its tree, never HEAD's."""
    found: dict[str, set[str]] = {}
    for pyproject in sorted(root.glob("clients/*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        src = pyproject.parent / "src"
        found[name] = {path.name for path in src.iterdir() if (path / "__init__.py").exists()}
    return found


def top_level_packages(root: Path) -> set[str]:
    """The packages a tree's processes can import from it: its own and its clients'."""
    own = {path.name for path in root.iterdir() if (path / "__init__.py").exists()}
    return own.union(*client_packages(root).values())


def _distribution(pin: str) -> str:
    return re.split(r"[\[=<>!~;]", pin, maxsplit=1)[0].strip().lower()


def dependencies(pyproject: Path, local: Collection[str] = ()) -> set[str]:
    """A project's pins, without the packages its own tree carries (`local`)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return {
        pin.replace(" ", "") for pin in project["dependencies"] if _distribution(pin) not in local
    }


def old_python(tree: Path, work: Path) -> str:
    """HEAD's interpreter when its virtualenv holds every pin of the old release (its own client
    packages aside: they come from its tree); else a virtualenv of the old release's own pins."""
    local = {name.lower() for name in client_packages(tree)}
    old_pins = dependencies(tree / "pyproject.toml", local)
    missing = old_pins - dependencies(PROJECT_ROOT / "pyproject.toml", local)
    if not missing:
        return sys.executable
    print(f"upgrade: the old release pins {sorted(missing)}: a virtualenv of its own", flush=True)
    home = work / "venv-old"
    venv.create(home, with_pip=True)
    subprocess.run([str(home / "bin" / "pip"), "install", "--quiet", *sorted(old_pins)], check=True)
    return str(home / "bin" / "python")


@contextlib.contextmanager
def fresh_database(server_url: str = POSTGRES_URL, prefix: str = "upgrade") -> Iterator[str]:
    """A database of its own on the PostgreSQL server at `server_url`, dropped afterwards;
    yields its URL."""
    admin = create_engine(normalise_url(server_url), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(normalise_url(server_url)).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def destinations_file(path: Path, fake_url: str) -> Path:
    """The destinations both releases load: the same file, as a deploy keeps it. The labour
    example's effects go to `fake-email` and `fake-webhook`, so those two keep its names."""
    hook = 'provider = "webhook"\nmax_attempts = 50\nbackoff_initial_s = 1\nbackoff_max_s = 4\n'

    def settings(name: str) -> str:
        url = f"{fake_url}/webhook/{name}"
        return (
            f'[destinations.{name}.settings]\nurl = "{url}"\nsecret = "{DEFAULT_WEBHOOK_SECRET}"\n'
        )

    path.write_text(
        f"""# The email items are held Running at the fake until HEAD has taken over.
[destinations.fake-email]
provider = "acs-email"
submit_rate = 5
poll_rate = 5
poll_interval_s = 1
poll_interval_max_s = 2
# No delivery reports: the fake sends none in this run.
report_window_s = 0
[destinations.fake-email.settings]
endpoint = "{fake_url}"
access_key = "{DEFAULT_ACS_ACCESS_KEY}"

# The paused destination with an open circuit; the labour's notifications go here too.
[destinations.fake-webhook]
{hook}submit_rate = 5
poll_rate = 5
[destinations.fake-webhook.flow]
breaker_min_failures = 3
breaker_window_s = 60
breaker_probe_interval_s = 2
{settings("fake-webhook")}
[destinations.up-lane]
{hook}submit_rate = 1
poll_rate = 1
{settings("up-lane")}
[destinations.up-bulk]
{hook}mode = "bulk"
shards = 2
submit_rate = 20
poll_rate = 20
submit_batch = 5
{settings("up-bulk")}
[destinations.up-hook]
{hook}submit_rate = 5
poll_rate = 5
{settings("up-hook")}
[destinations.up-dead]
provider = "webhook"
max_attempts = 2
backoff_initial_s = 1
{settings("up-dead")}"""
    )
    return path


def process_env(database_url: str, temporal: str, config: Path, keys: str) -> dict[str, str]:
    """The settings every process of both releases gets (names both releases read)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DEST_", "TEMPORAL_", "OTEL_")) and name != "PYTHONPATH"
    }
    env.update(
        {
            "TEMPORAL_ADDRESS": temporal,
            "TEMPORAL_NAMESPACE": "default",
            "DATABASE_URL": database_url,
            "OUTBOX_CONFIG": str(config),
            "PAYLOAD_KEYS": keys,
            "API_TOKEN": "",
            "OUTBOX_ENV": "development",
            "WORKER_METRICS_ADDRESS": "",
            # No relay rows in this run: its poll of the database would only take CPU.
            "RELAY_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def old_children(python: str, tree: Path, api_port: int) -> list[Child]:
    head_only = sorted(top_level_packages(PROJECT_ROOT) - top_level_packages(tree))
    guard = [python, "-c", GUARD, str(tree), ",".join(head_only)]
    return [
        Child("old-worker", [*guard, "worker.py"], lambda: True, ready_line=WORKER_READY_LINE),
        Child(
            "old-api",
            [*guard, "-m", "uvicorn", "api.main:create_app", "--factory", "--port", str(api_port)],
            http_ok(f"http://127.0.0.1:{api_port}/healthz"),
            ports=(api_port,),
        ),
    ]


def head_children(api_port: int) -> list[Child]:
    python = sys.executable
    return [
        Child(
            "worker",
            [python, str(PROJECT_ROOT / "worker.py")],
            lambda: True,
            ready_line=WORKER_READY_LINE,
            # Longer than its WORKER_SHUTDOWN_GRACE_S (30 s), as docker-compose gives it.
            stop_grace_s=40.0,
        ),
        Child(
            "api",
            [python, "-m", "uvicorn", "api.main:create_app", "--factory", "--port", str(api_port)],
            http_ok(f"http://127.0.0.1:{api_port}/healthz"),
            ports=(api_port,),
        ),
    ]


def head_env(env: dict[str, str]) -> dict[str, str]:
    """HEAD's processes import HEAD's tree (and its client packages) first."""
    paths = [
        PROJECT_ROOT,
        PROJECT_ROOT / "clients/temporal/src",
        PROJECT_ROOT / "clients/python/src",
    ]
    return {**env, "PYTHONPATH": os.pathsep.join(str(path) for path in paths)}


async def until(
    what: str,
    check: Callable[[], Awaitable[bool]],
    timeout_s: float,
    give_up: Callable[[], list[str]] = list,
) -> None:
    """Poll `check` every half second until it holds; UpgradeFailure naming `what` if never,
    or as soon as `give_up` names a reason to stop waiting."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if reasons := give_up():
            raise UpgradeFailure(f"{what}: stopped waiting ({reasons[0][:200]})")
        if time.monotonic() > deadline:
            raise UpgradeFailure(f"{what}: not after {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


def nondeterminism(worker_log: Path) -> list[str]:
    """The lines of a worker's log about non-determinism or a failed workflow task."""
    lines = (ANSI_COLOUR.sub("", line) for line in worker_log.read_text().splitlines())
    # The SDK core's failure lines bury the message in a long struct: start from it.
    return [
        line[max(line.find("message:"), 0) :][:300] for line in lines if NONDETERMINISM.search(line)
    ]


async def call(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> Any:
    response = await http.request(method, path, **kwargs)
    if response.status_code >= 400:
        raise UpgradeFailure(f"{method} {path}: {response.status_code} {response.text[:300]}")
    return response.json() if response.content else None


async def items_of(http: httpx.AsyncClient, outbox: str, **filters: str) -> list[dict[str, Any]]:
    """Every item of `outbox` in the read model (all pages)."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {**filters, "limit": "200", **({"cursor": cursor} if cursor else {})}
        page = await call(http, "GET", f"/v1/outboxes/{outbox}/items", params=params)
        found += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return found


async def enqueue(http: httpx.AsyncClient, key: str, body: dict[str, Any]) -> None:
    await call(
        http, "POST", f"/v1/outboxes/{OUTBOX}/items", json=body, headers={"Idempotency-Key": key}
    )


def deliveries(fake: FakeProvider, endpoint: str) -> list[dict[str, Any]]:
    return [entry for entry in fake.state.delivery_log if entry["endpoint"] == endpoint]


def scheduled_fires(fake: FakeProvider) -> list[dict[str, Any]]:
    return [entry for entry in deliveries(fake, "up-hook") if "at" in entry["payload"]]


async def command(
    http: httpx.AsyncClient, kind: str, ident: str, name: str, body: dict[str, Any]
) -> Any:
    return await call(http, "POST", f"/v1/aggregates/{kind}/{ident}/commands/{name}", json=body)


async def aggregate_events(http: httpx.AsyncClient, kind: str, ident: str) -> list[Any]:
    events = await call(http, "GET", f"/v1/aggregates/{kind}/{ident}/events", params={"limit": 500})
    return [{name: event[name] for name in ("seq", "type", "data")} for event in events]


async def dead_letters(http: httpx.AsyncClient) -> list[Any]:
    page = await call(http, "GET", f"/v1/outboxes/{OUTBOX}/dead-letters", params={"limit": 100})
    keep = ("key", "destination", "attempts", "last_error", "last_error_code", "discarded")
    return sorted(
        ({name: letter[name] for name in keep} for letter in page["dead_letters"]),
        key=lambda letter: str(letter["key"]),
    )


async def put_work_in_flight(run: Run, http: httpx.AsyncClient) -> None:
    """Every kind of long-lived work, through the old release's API, left mid-way."""
    fake = run.fake
    # Dead letters: a receiver that refuses for good.
    fake.state.endpoint_faults["up-dead"] = Step(status=400, body="refused for good")
    for n in range(DEAD_ITEMS):
        await enqueue(http, f"dead-{n}", {"destination": "up-dead", "payload": {"n": n}})
    # A destination whose receiver fails until HEAD runs: its circuit opens, then an operator
    # pauses it too.
    fake.state.endpoint_faults["fake-webhook"] = Step(status=500)
    for n in range(BREAKER_ITEMS):
        await enqueue(http, f"breaker-{n}", {"destination": "fake-webhook", "payload": {"n": n}})

    async def circuit_open() -> bool:
        view = await call(http, "GET", "/v1/destinations/fake-webhook")
        return bool(view["circuit"] == "open")

    await until("the circuit of fake-webhook opens", circuit_open, 90)
    await call(
        http,
        "PATCH",
        "/v1/destinations/fake-webhook",
        json={"paused": True, "reason": "upgrade: held across the deploy"},
    )
    # A labour whose announcement plans a notification per subscriber: their items wait on the
    # paused destination.
    mother, friend = "mother-1", "friend-1"
    contact = {"webhook": "https://example.com/hooks/friend"}
    await command(
        http,
        "labour",
        "upgrade-1",
        "plan_labour",
        {"actor": mother, "mother_name": "Ada", "contact": {"email": "ada@example.com"}},
    )

    async def token() -> str | None:
        view = await call(http, "GET", "/v1/aggregates/labour/upgrade-1", params={"actor": mother})
        found = view["state"].get("subscription_token")
        return None if found is None else str(found)

    async def has_token() -> bool:
        return await token() is not None

    await until("the labour's subscription token (an effect)", has_token, 60)
    await command(
        http,
        "labour",
        "upgrade-1",
        "request_access",
        {"actor": friend, "token": await token(), "name": "Friend", "contact": contact},
    )
    await command(
        http,
        "labour",
        "upgrade-1",
        "approve_subscriber",
        {"actor": mother, "subscriber": friend, "role": "observer"},
    )
    await command(
        http,
        "labour",
        "upgrade-1",
        "post_update",
        {"actor": mother, "message": "It's a girl", "kind": "announcement"},
    )
    # A schedule: it fires under the old release (its first fire is awaited), then under HEAD.
    await call(
        http,
        "POST",
        "/v1/schedules",
        json={
            "id": "upgrade-every",
            "outbox": OUTBOX,
            "interval_seconds": SCHEDULE_EVERY_S,
            "items": [{"destination": "up-hook", "payload": {"at": "{{scheduled_at}}"}}],
        },
    )
    # Items mid-poll: their operations stay Running until HEAD has taken over.
    fake.state.faults.running_polls = 1_000_000
    for n in range(EMAIL_ITEMS):
        email = {
            "senderAddress": "noreply@example.com",
            "recipients": {"to": [{"address": f"user{n}@example.com"}]},
            "content": {"subject": "Upgrade", "plainText": f"mail {n}"},
        }
        await enqueue(http, f"email-{n}", {"destination": "fake-email", "payload": email})

    async def fired_and_polled() -> bool:
        emails = await items_of(http, OUTBOX, destination="fake-email")
        return (
            len(scheduled_fires(fake)) >= 1
            and len(emails) == EMAIL_ITEMS
            and all(item["poll_count"] >= 1 for item in emails)
            and len(await dead_letters(http)) == DEAD_ITEMS
        )

    await until("a first schedule fire, the emails polled, the dead letters", fired_and_polled, 90)
    # A lane at one submit a second; a bulk destination whose every request takes seconds.
    fake.state.endpoint_faults["up-bulk"] = Step(latency_ms=BULK_LATENCY_MS)
    for n in range(LANE_ITEMS):
        await enqueue(
            http,
            f"lane-{n:03d}",
            {"destination": "up-lane", "ordering_key": "upgrade-lane", "payload": {"seq": n}},
        )
    batch = [
        {"destination": "up-bulk", "idempotency_key": f"bulk-{n:03d}", "payload": {"n": n}}
        for n in range(BULK_ITEMS)
    ]
    await call(http, "POST", f"/v1/outboxes/{OUTBOX}/items:batch", json={"items": batch})

    async def mid_way() -> bool:
        return (
            len(deliveries(fake, "up-lane")) >= LANE_ITEMS // 4
            and len(deliveries(fake, "up-bulk")) > 0
        )

    await until("the lane and the bulk shard mid-way", mid_way, 90)
    # A lock whose lease ends on a timer after the deploy, and a debounce window still open.
    await command(http, "lock", "upgrade-lock", "acquire", {"holder": "old", "ttl_s": 45})
    for n in range(DEBOUNCE_ITEMS):
        await enqueue(
            http,
            f"debounce-{n}",
            {
                "destination": "up-hook",
                "payload": {"edit": n},
                "debounce_key": "profile-1",
                "debounce_s": 40,
            },
        )
    run.before = {
        "lane_delivered": len(deliveries(fake, "up-lane")),
        "bulk_delivered": len(deliveries(fake, "up-bulk")),
        "schedule_fires": len(scheduled_fires(fake)),
        "dead_letters": await dead_letters(http),
        "labour_events": await aggregate_events(http, "labour", "upgrade-1"),
        "lock_events": await aggregate_events(http, "lock", "upgrade-lock"),
        "labour_effects": await call(http, "GET", "/v1/aggregates/labour/upgrade-1/effects"),
    }


async def release_and_settle(run: Run, http: httpx.AsyncClient, worker_log: Path) -> dict[str, str]:
    """Under HEAD: the receiver recovers, the operations end, the destination resumes; wait
    until every item is final (no longer once HEAD's worker reports non-determinism: what it
    cannot replay never finishes). Returns each item's status by key."""
    fake = run.fake
    fake.state.endpoint_faults.pop("fake-webhook", None)
    fake.state.faults.running_polls = 0
    for operation in fake.state.operations.values():
        operation.polls_left = 0
    await call(http, "PATCH", "/v1/destinations/fake-webhook", json={"paused": False})

    async def fired_under_head() -> bool:
        return any(entry["at"] > run.switched_at for entry in deliveries(fake, "up-hook"))

    await until("a schedule fire under HEAD", fired_under_head, SCHEDULE_EVERY_S * 4)
    await call(http, "DELETE", "/v1/schedules/upgrade-every")
    statuses: dict[str, str] = {}

    async def settled() -> bool:
        statuses.clear()
        for outbox in (OUTBOX, "labour-notifications"):
            for item in await items_of(http, outbox):
                statuses[f"{outbox}/{item['key']}"] = item["status"]
        return not any(status in ("queued", "sending") for status in statuses.values())

    async def lease_expired() -> bool:
        events = await aggregate_events(http, "lock", "upgrade-lock")
        return any(event["type"] == "LeaseExpired" for event in events)

    async def circuit_closed() -> bool:
        view = await call(http, "GET", "/v1/destinations/fake-webhook")
        return bool(view["circuit"] == "closed" and not view["paused"])

    began = time.monotonic()
    for what, check in (
        ("every item final", settled),
        ("the lock's lease expired", lease_expired),
        ("the circuit closed", circuit_closed),
    ):
        try:
            timeout_s = max(10.0, SETTLE_S - (time.monotonic() - began))
            await until(what, check, timeout_s, lambda: nondeterminism(worker_log))
        except UpgradeFailure as err:
            run.problems.append(str(err))
    run.timings["settle_s"] = round(time.monotonic() - began, 1)
    return statuses


def judge_deliveries(run: Run, statuses: dict[str, str]) -> None:
    """Nothing lost, doubled or out of order, at the provider and in the read model."""
    fake, problems = run.fake, run.problems
    unfinished = sorted(key for key, status in statuses.items() if status in ("queued", "sending"))
    if unfinished:
        problems.append(f"{len(unfinished)} items never finished: {unfinished[:10]}")
    by_status = Counter(statuses.values())
    run.findings["items_by_status"] = dict(by_status)
    failed = sorted(key for key, status in statuses.items() if status == "failed")
    expected_failed = sorted(f"{OUTBOX}/dead-{n}" for n in range(DEAD_ITEMS))
    if failed != expected_failed:
        problems.append(f"failed items {failed}, expected only the dead letters {expected_failed}")
    doubled = {
        key: stats.deliveries for key, stats in fake.state.keys.items() if stats.deliveries > 1
    }
    if doubled:
        problems.append(f"delivered more than once at the provider: {doubled}")
    expected = {
        "emails": EMAIL_ITEMS,
        "up-lane": LANE_ITEMS,
        "up-bulk": BULK_ITEMS,
        # The breaker's items and the labour's notification to its one subscriber.
        "fake-webhook": BREAKER_ITEMS + 1,
    }
    counts = Counter(entry["endpoint"] for entry in fake.state.delivery_log)
    run.findings["deliveries"] = dict(counts)
    for endpoint, want in expected.items():
        if counts[endpoint] != want:
            problems.append(f"{endpoint}: {counts[endpoint]} deliveries, expected {want}")
    # Each kind of work was still in flight at the deploy: HEAD's worker made requests for it.
    for path in (
        "/emails/operations/",
        "/webhook/up-lane",
        "/webhook/up-bulk",
        "/webhook/fake-webhook",
    ):
        if not any(
            at > run.switched_mono and seen.startswith(path) for at, seen in fake.state.requests
        ):
            problems.append(f"{path}: HEAD made no request, nothing was left in flight for it")
    lane = [entry["payload"]["seq"] for entry in deliveries(fake, "up-lane")]
    if lane != list(range(LANE_ITEMS)):
        problems.append(f"the lane arrived out of order or incomplete: {lane}")
    debounced = [entry for entry in deliveries(fake, "up-hook") if "edit" in entry["payload"]]
    last = {"edit": DEBOUNCE_ITEMS - 1}
    if [entry["payload"] for entry in debounced] != [last]:
        problems.append(f"the debounce window delivered {debounced}, expected once {last}")
    elif debounced[0]["at"] < run.switched_at:
        problems.append("the debounce window closed before the deploy, not across it")
    superseded = by_status.get("superseded", 0)
    if superseded != DEBOUNCE_ITEMS - 1:
        problems.append(f"{superseded} superseded items, expected {DEBOUNCE_ITEMS - 1}")
    fires = scheduled_fires(fake)
    scheduled = sum(1 for key in statuses if key.startswith(f"{OUTBOX}/upgrade-every:"))
    run.findings["schedule_fires"] = {"before": run.before["schedule_fires"], "all": len(fires)}
    if len(fires) != scheduled:
        problems.append(f"{len(fires)} scheduled deliveries for {scheduled} scheduled items")


async def judge_stores(run: Run, http: httpx.AsyncClient) -> None:
    """The dead letters and the aggregates' event stores as the old release left them."""
    problems = run.problems
    if await dead_letters(http) != run.before["dead_letters"]:
        problems.append("the dead letters changed across the upgrade")
    for kind, ident, name in (("labour", "upgrade-1", "labour"), ("lock", "upgrade-lock", "lock")):
        before = run.before[f"{name}_events"]
        after = await aggregate_events(http, kind, ident)
        if after[: len(before)] != before:
            problems.append(f"the {kind} {ident}'s event store changed across the upgrade")
        run.findings[f"{name}_events"] = {"before": len(before), "after": len(after)}
    effects = await call(http, "GET", "/v1/aggregates/labour/upgrade-1/effects")
    unsettled = [effect["key"] for effect in effects if effect["status"] != "done"]
    if unsettled:
        problems.append(f"labour effects not done: {unsettled}")
    keys_before = sorted(effect["key"] for effect in run.before["labour_effects"])
    if sorted(effect["key"] for effect in effects) != keys_before:
        problems.append(f"the labour's effect ledger changed: {keys_before} before")


async def judge_determinism(run: Run, worker_log: Path) -> None:
    """No non-determinism: none in HEAD's worker log, no WorkflowTaskFailed in any history."""
    lines = await asyncio.to_thread(nondeterminism, worker_log)
    if lines:
        run.problems.append(f"HEAD's worker log reports failed workflow tasks: {lines[:2]}")
    failed_tasks: list[str] = []
    histories = 0
    async for execution in run.client.list_workflows():
        histories += 1
        handle = run.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attributes = event.workflow_task_failed_event_attributes
                failed_tasks.append(f"{execution.id}: {attributes.failure.message[:200]}")
    run.findings["histories_scanned"] = histories
    if failed_tasks:
        run.problems.append(f"{len(failed_tasks)} WorkflowTaskFailed events: {failed_tasks[:3]}")


def leak_check(run: Run, logs: Path) -> None:
    """Both old processes ran only the old release's code."""
    for name in ("old-worker", "old-api"):
        text_ = (logs / f"{name}.log").read_text()
        if "upgrade-guard: clean" not in text_:
            leaked = re.findall(r"upgrade-guard: .*", text_)
            run.problems.append(
                f"{name} did not run on the old tree alone: {leaked or 'no report'}"
            )


def migrate_with_head(env: dict[str, str], logs: Path) -> None:
    """HEAD's alembic, as a release step before HEAD's processes start."""
    with (logs / "alembic.log").open("wb") as log:
        done = subprocess.run(
            [find_binary("alembic"), "upgrade", "heads"],
            cwd=PROJECT_ROOT,
            env=head_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        raise UpgradeFailure(f"HEAD's alembic upgrade failed (see {logs / 'alembic.log'})")


@contextlib.asynccontextmanager
async def stack_of(children: list[Child], env: dict[str, str], logs: Path) -> AsyncIterator[None]:
    await asyncio.to_thread(start, children, env, logs)
    try:
        yield
    finally:
        await asyncio.to_thread(stop, children)


async def upgrade(previous: Release, work: Path) -> Run:
    logs = work / "logs"
    began = time.monotonic()
    tree = extract_release(previous, work)
    python = old_python(tree, work)
    temporal_port, api_port = free_port(), free_port()
    with fresh_database() as database_url:
        server = DevServer(work / "temporal.db", port=temporal_port, ui_port=free_port())
        async with server, run_fake_provider(FaultConfig()) as fake:
            env = process_env(
                database_url,
                server.address,
                destinations_file(work / "destinations.toml", fake.url),
                new_key_setting("upgrade-1"),
            )
            client = await Client.connect(server.address)
            run = Run(f"http://127.0.0.1:{api_port}", fake, client)
            async with httpx.AsyncClient(base_url=run.api, timeout=30) as http:
                old = old_children(python, tree, api_port)
                async with stack_of(old, {**env, "PYTHONPATH": str(tree)}, logs):
                    run.timings["old_start_s"] = round(time.monotonic() - began, 1)
                    await put_work_in_flight(run, http)
                    run.timings["in_flight_at_s"] = round(time.monotonic() - began, 1)
                    stopping = time.monotonic()
                run.timings["old_stop_s"] = round(time.monotonic() - stopping, 1)
                leak_check(run, logs)
                migrating = time.monotonic()
                await asyncio.to_thread(migrate_with_head, env, logs)
                run.timings["migrate_s"] = round(time.monotonic() - migrating, 1)
                run.switched_at, run.switched_mono = time.time(), time.monotonic()
                async with stack_of(head_children(api_port), head_env(env), logs):
                    run.timings["head_start_s"] = round(time.monotonic() - run.switched_mono, 1)
                    statuses = await release_and_settle(run, http, logs / "worker.log")
                    judge_deliveries(run, statuses)
                    await judge_stores(run, http)
                await judge_determinism(run, logs / "worker.log")
    run.timings["total_s"] = round(time.monotonic() - began, 1)
    return run


def main(argv: list[str] | None = None) -> int:
    known = releases()
    parser = argparse.ArgumentParser(
        prog="python -m bench.upgrade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--from",
        dest="previous",
        choices=list(known),
        default=list(known)[-1],
        help="the release to upgrade from (default: the newest in CHANGELOG.md)",
    )
    previous = known[parser.parse_args(argv).previous]
    work = Path(tempfile.mkdtemp(prefix="outbox-upgrade-"))
    print(f"upgrade: {previous.version} ({previous.commit}) -> HEAD in {work}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run = asyncio.run(upgrade(previous, work))
    except (UpgradeFailure, subprocess.CalledProcessError, RuntimeError) as err:
        print(f"upgrade: could not run: {err}", file=sys.stderr)
        print(f"upgrade from {previous.version}: FAIL")
        return 1
    finally:
        keep_logs(work)
    report: dict[str, Any] = {
        "from": f"{previous.version} ({previous.commit})",
        **{f"timing_{name}": value for name, value in run.timings.items()},
        "in_flight_at_stop": {
            name: run.before[name]
            for name in ("lane_delivered", "bulk_delivered", "schedule_fires")
        },
        **run.findings,
        "problems": run.problems,
    }
    return verdict(f"upgrade from {previous.version}", report, run.problems, REPORT_PATH)


def keep_logs(work: Path) -> None:
    """The processes' logs go under `.bench/upgrade-logs/`; the working directory is removed
    unless UPGRADE_KEEP=1."""
    kept = REPORT_PATH.parent / "upgrade-logs"
    shutil.rmtree(kept, ignore_errors=True)
    if (work / "logs").exists():
        shutil.copytree(work / "logs", kept)
        print(f"upgrade: logs in {kept}")
    if os.environ.get("UPGRADE_KEEP") != "1":
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
