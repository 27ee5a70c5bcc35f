"""`make dev`: the whole stack in one terminal — Temporal dev server, fake provider, worker, API.

Each process's output is prefixed with its name. Ctrl-C or SIGTERM stops everything, newest
first (a second Ctrl-C kills what is left at once). A process that dies once the stack is up is
restarted after a backoff (1 s doubling to 30 s, back to 1 s once it has stayed up a minute), so
killing a worker shows recovery rather than ending the session; one that fails during start-up
stops the stack, as that is a configuration error a retry will not fix. Items persist in the data
directory across restarts.

Environment (defaults): DEV_TEMPORAL_PORT (7233), DEV_UI_PORT (8233), DEV_FAKE_PORT (8025),
DEV_API_PORT (8000), DEV_DATA_DIR (.data), DEV_FAKE_REPORTS (1; 0: the fake sends no delivery
reports), DEV_FAKE_ARGS (none: extra fake provider flags such as
`--bounce-rate 0.2 --duplicate-reports`, which win over the stack's own),
DEV_TEMPORAL_METRICS_PORT (random: the dev server's Prometheus `/metrics`). The children get the
matching TEMPORAL_ADDRESS and FAKE_PROVIDER_URL, and DATABASE_URL (SQLite in the data directory)
unless it is set. While the stack is up, its API's URL is in `api-url` in the data directory,
where the `outbox` CLI looks for its default API.

The fake provider POSTs its ACS delivery reports (as Event Grid would) to the API's
`/v1/destinations/fake-email/events` (SMS reports: `.../fake-sms/events`), with the secret both
destinations check: FAKE_EMAIL_EVENTS_SECRET (dev-events-secret), set in every child's environment
(never on a command line) so both sides agree. Mail to bounce@… bounces.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from durable_outbox_temporal.codec import new_key_setting

from configuration.api_address import (
    API_URL_FILE,
    DEFAULT_DEV_API_PORT,
    dev_api_url,
    dev_data_dir,
)
from configuration.settings import DEV_EVENTS_SECRET, PROJECT_ROOT
from devstack.temporal_server import (
    STOP_GRACE_S,
    dev_server_command,
    port_in_use,
    serving_with_search_attributes,
)

COLOURS = {"temporal": "35", "fake": "36", "worker": "33", "api": "32"}
START_TIMEOUT_S = 60.0
RESTART_INITIAL_S = 1.0
RESTART_MAX_S = 30.0
# A run this long counts as healthy: the next crash restarts after RESTART_INITIAL_S again.
RESTART_RESET_AFTER_S = 60.0
# The worker logs this once every worker of the process polls (worker.py); it opens no port.
WORKER_READY_LINE = "worker ready"


class StartupError(RuntimeError):
    """A child could not start or never became ready."""


class StartCancelled(Exception):
    """Ctrl-C or SIGTERM arrived while the stack was starting."""


@dataclass
class RestartBackoff:
    """The delay before each restart of one child: doubling, and reset after a long enough run."""

    initial_s: float = RESTART_INITIAL_S
    max_s: float = RESTART_MAX_S
    reset_after_s: float = RESTART_RESET_AFTER_S
    next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_s = self.initial_s

    def delay_after(self, uptime_s: float) -> float:
        """The delay before restarting a child that ran for `uptime_s` seconds."""
        if uptime_s >= self.reset_after_s:
            self.next_s = self.initial_s
        delay = self.next_s
        self.next_s = min(delay * 2, self.max_s)
        return delay


@dataclass
class Child:
    """One process of the stack, with the check that says it is ready."""

    name: str
    command: list[str]
    ready: Callable[[], bool]
    # Ports it listens on: checked free before anything starts, so a leftover server is named.
    ports: tuple[int, ...] = ()
    # When set, the child is ready only once this text has appeared in its output too.
    ready_line: str | None = None
    stop_grace_s: float = 15.0
    backoff: RestartBackoff = field(default_factory=RestartBackoff, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_at: float = field(default=0.0, repr=False)
    # Set while the child is dead and waiting for its restart (a monotonic time).
    restart_at: float | None = field(default=None, repr=False)
    # Restarted but not ready yet: the stack says so once it is.
    recovering: bool = field(default=False, repr=False)
    log_file: Path | None = field(default=None, repr=False)
    log_offset: int = field(default=0, repr=False)
    ready_line_seen: threading.Event = field(default_factory=threading.Event, repr=False)
    output_thread: threading.Thread | None = field(default=None, repr=False)

    def is_ready(self) -> bool:
        if self.ready_line is not None and not self._saw_ready_line():
            return False
        return self.ready()

    def _saw_ready_line(self) -> bool:
        if self.ready_line_seen.is_set():
            return True
        if self.log_file is not None and self.ready_line is not None:
            with self.log_file.open("rb") as log:
                log.seek(self.log_offset)
                if self.ready_line.encode() in log.read():
                    self.ready_line_seen.set()
        return self.ready_line_seen.is_set()


def port_open(port: int) -> Callable[[], bool]:
    return lambda: port_in_use(port)


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
                return bool(response.status == 200)
        except OSError:
            return False

    return check


def temporal_serving(port: int) -> Callable[[], bool]:
    """gRPC answers and the search attributes are registered (the port opens before that)."""
    return lambda: (
        port_in_use(port) and asyncio.run(serving_with_search_attributes(f"127.0.0.1:{port}"))
    )


def _use_colour() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def _pipe_output(child: Child, colour: bool) -> None:
    assert child.process is not None and child.process.stdout is not None
    label = f"{child.name:>8} |"
    prefix = f"\033[{COLOURS.get(child.name, '0')}m{label}\033[0m " if colour else f"{label} "
    for line in iter(child.process.stdout.readline, b""):
        text = line.decode(errors="replace")
        if child.ready_line is not None and child.ready_line in text:
            child.ready_line_seen.set()
        sys.stdout.write(prefix + text)
        sys.stdout.flush()


def build_children(env: dict[str, str]) -> list[Child]:
    """The four processes, in start order, configured from DEV_* variables (`env` is updated)."""
    data_dir = dev_data_dir(env)
    temporal_port = int(env.get("DEV_TEMPORAL_PORT", "7233"))
    ui_port = int(env.get("DEV_UI_PORT", "8233"))
    metrics_port = env.get("DEV_TEMPORAL_METRICS_PORT")
    fake_port = int(env.get("DEV_FAKE_PORT", "8025"))
    api_port = int(env.get("DEV_API_PORT", DEFAULT_DEV_API_PORT))
    python = sys.executable
    # The stack's own servers, whatever a shell or .env points at (a cloud cluster, say).
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{temporal_port}"
    env["TEMPORAL_NAMESPACE"] = "default"
    env["FAKE_PROVIDER_URL"] = f"http://127.0.0.1:{fake_port}"
    env.setdefault("DATABASE_URL", f"sqlite:///{data_dir / 'readmodel.db'}")
    # Payloads encrypted from the first run, as production should run: a development key made
    # once under the data directory (PAYLOAD_KEYS set by the user wins).
    env.setdefault("PAYLOAD_KEYS", dev_payload_keys(data_dir))
    # The fake's Event Grid reports to the API with the secret `fake-email` is configured with,
    # which the fake reads from its environment: a command line is visible to `ps`.
    env.setdefault("FAKE_EMAIL_EVENTS_SECRET", DEV_EVENTS_SECRET)
    # The Web UI calls the API's codec server from its own origin: the port in use, not 8233.
    env.setdefault("CODEC_CORS_ORIGINS", f"http://127.0.0.1:{ui_port},http://localhost:{ui_port}")
    report_url = f"http://127.0.0.1:{api_port}/v1/destinations/fake-email/events"
    sms_report_url = f"http://127.0.0.1:{api_port}/v1/destinations/fake-sms/events"
    # Children write to a pipe: without this, Python would hold their output back in buffers.
    env["PYTHONUNBUFFERED"] = "1"
    fake = [
        *[python, "-m", "devstack.fake_provider", "--host", "127.0.0.1", "--port", str(fake_port)],
        # DEV_FAKE_REPORTS=0 (the benchmarks) keeps report traffic out of the measurement.
        *(
            ["--report-url", report_url, "--sms-report-url", sms_report_url]
            if env.get("DEV_FAKE_REPORTS", "1") != "0"
            else []
        ),
    ]
    api = [python, "-m", "uvicorn", "api.main:create_app", "--factory"]
    return [
        Child(
            "temporal",
            [
                *dev_server_command(
                    data_dir / "temporal.db",
                    port=temporal_port,
                    ui_port=ui_port,
                    metrics_port=int(metrics_port) if metrics_port else None,
                ),
                # The Web UI decrypts through the API's codec server, for whoever may read.
                *["--ui-codec-endpoint", f"http://127.0.0.1:{api_port}/codec"],
            ],
            temporal_serving(temporal_port),
            ports=(temporal_port, ui_port),
            stop_grace_s=STOP_GRACE_S,
        ),
        Child(
            "fake",
            # Flags given later win (argparse keeps the last), so the user's come last.
            [*fake, *shlex.split(env.get("DEV_FAKE_ARGS", ""))],
            http_ok(f"http://127.0.0.1:{fake_port}/_admin/stats"),
            ports=(fake_port,),
        ),
        Child(
            "worker",
            [python, str(PROJECT_ROOT / "worker.py")],
            lambda: True,
            ready_line=WORKER_READY_LINE,
        ),
        Child(
            "api",
            [*api, "--host", "127.0.0.1", "--port", str(api_port)],
            http_ok(f"http://127.0.0.1:{api_port}/healthz"),
            ports=(api_port,),
        ),
    ]


def dev_payload_keys(data_dir: Path) -> str:
    """The development `PAYLOAD_KEYS`: generated once into `payload-keys` under `data_dir`
    (readable by its owner only) and read from there after."""
    path = data_dir / "payload-keys"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(new_key_setting("dev-1") + "\n")
    return path.read_text().strip()


def api_requires_token(api_url: str) -> bool:
    """Whether the running API answers 401 to a request without a token."""
    try:
        with urllib.request.urlopen(f"{api_url}/v1/outboxes", timeout=5):  # noqa: S310
            return False
    except urllib.error.HTTPError as err:
        return err.code == 401
    except OSError:
        return False


def banner(env: dict[str, str]) -> str:
    """What is running where, how to call it, and whether the API asks for a token."""
    api = dev_api_url(env)
    ui = f"http://127.0.0.1:{env.get('DEV_UI_PORT', '8233')}"
    data_dir = dev_data_dir(env)
    # Ask the API itself: its tokens may come from the environment or from the project's .env.
    if api_requires_token(api):
        auth = "bearer token required (API_TOKEN)"
        auth_header = '-H "Authorization: Bearer $API_TOKEN" '
    else:
        auth = "OPEN: no API_TOKEN set, anyone who reaches the port can call it"
        auth_header = ""
    return f"""
  durable-outbox is up
    API               {api}   ({auth})
    OpenAPI docs      {api}/docs
    Dashboard         {api}/
    Temporal Web UI   {ui}
    Fake provider     {env["FAKE_PROVIDER_URL"]}   (stats: /_admin/stats; reports to the API)

  Try:
    curl -s -X POST {api}/v1/outboxes/demo/items {auth_header}\\
      -H 'Content-Type: application/json' -H 'Idempotency-Key: hello-1' \\
      -d '{{"destination": "fake-webhook", "payload": {{"hello": "world"}}}}'
    curl -s {auth_header}{api}/v1/outboxes/demo/items/hello-1

    # An email to two recipients; bounce@… bounces. Its delivery reports arrive in seconds:
    curl -s -X POST {api}/v1/outboxes/demo/items {auth_header}\
      -H 'Content-Type: application/json' -H 'Idempotency-Key: welcome-1' \
      -d '{{"destination": "fake-email", "payload": {{"senderAddress": "noreply@example.com",
           "recipients": {{"to": [{{"address": "ada@example.com"}},
                                  {{"address": "bounce@example.com"}}]}},
           "content": {{"subject": "Welcome", "plainText": "Hi"}}}}}}'
    curl -s {auth_header}{api}/v1/outboxes/demo/items/welcome-1   # recipients, delivery

    # An SMS to two numbers (E.164); +999… is refused, the other is reported delivered:
    curl -s -X POST {api}/v1/outboxes/demo/items {auth_header}\
      -H 'Content-Type: application/json' -H 'Idempotency-Key: sms-1' \
      -d '{{"destination": "fake-sms", "payload": {{"from": "+18005550100",
           "smsRecipients": [{{"to": "+15550100"}}, {{"to": "+9995550100"}}],
           "message": "Your code is 1234"}}}}'
    curl -s {auth_header}{api}/v1/outboxes/demo/items/sms-1

    # A payment through the fake payment API (pm_card_chargeDeclined is declined: 402):
    curl -s -X POST {api}/v1/outboxes/demo/items {auth_header}\
      -H 'Content-Type: application/json' -H 'Idempotency-Key: pay-1' \
      -d '{{"destination": "fake-payments", "payload": {{"amount": 2000, "currency": "eur",
           "payment_method": "pm_card_visa"}}}}'

  Ctrl-C stops everything; items persist in {data_dir}.
"""


def start(
    children: list[Child],
    env: dict[str, str],
    log_dir: Path | None = None,
    stopping: threading.Event | None = None,
) -> None:
    """Start each child in turn and wait until it is ready.

    Output goes to the terminal with a name prefix, or to `log_dir/<name>.log` when given.
    Raises StartupError naming the child that failed, StartCancelled if `stopping` gets set.
    """
    colour = _use_colour()
    for child in children:
        for port in child.ports:
            if port_in_use(port):
                raise StartupError(
                    f"{child.name}: port {port} is already in use (is the stack running "
                    "already? the DEV_*_PORT variables choose other ports)"
                )
    for child in children:
        spawn(child, env, log_dir, colour)
        _wait_until_ready(child, children, stopping)


def spawn(
    child: Child, env: dict[str, str], log_dir: Path | None, colour: bool
) -> subprocess.Popen[bytes]:
    """Start `child`'s process, its output going to `log_dir/<name>.log` or to the terminal."""
    output: IO[bytes] | int = subprocess.PIPE
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        child.log_file = log_dir / f"{child.name}.log"
        output = child.log_file.open("ab")
        child.log_offset = output.tell()
    child.ready_line_seen.clear()  # a new process must say it is ready itself
    try:
        child.process = subprocess.Popen(
            child.command,
            cwd=PROJECT_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        )
    finally:
        if not isinstance(output, int):
            output.close()  # the child has its own copy of the descriptor
    child.started_at = time.monotonic()
    if log_dir is None:
        child.output_thread = threading.Thread(
            target=_pipe_output, args=(child, colour), daemon=True
        )
        child.output_thread.start()
    return child.process


def _wait_until_ready(
    child: Child, children: list[Child], stopping: threading.Event | None
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not child.is_ready():
        if stopping is not None and stopping.is_set():
            raise StartCancelled
        died = first_exited(children)
        if died is not None:
            assert died.process is not None
            raise StartupError(
                f"{died.name} exited during start-up with code {died.process.returncode}"
            )
        if time.monotonic() > deadline:
            raise StartupError(f"{child.name} not ready after {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def first_exited(children: list[Child]) -> Child | None:
    """The first started child that is no longer running, if any."""
    for child in children:
        if child.process is not None and child.process.poll() is not None:
            return child
    return None


def supervise(children: list[Child], env: dict[str, str], colour: bool) -> None:
    """One pass over a running stack: schedule a restart for each child that died, restart those
    whose delay is over, and say when a restarted child is ready again.

    All four children are restarted alike. The dev server keeps its history in the data
    directory, and the worker and the API reconnect to it; the fake provider comes back with
    empty counters and no faults, which only matters to someone reading its stats.
    """
    now = time.monotonic()
    for child in children:
        process = child.process
        if process is None:
            continue
        if child.restart_at is None and process.poll() is not None:
            delay = child.backoff.delay_after(now - child.started_at)
            child.restart_at = now + delay
            _say(f"{child.name} exited with code {process.returncode}; restarting in {delay:g}s")
        elif child.restart_at is not None and now >= child.restart_at:
            _release_output(child)
            log_dir = child.log_file.parent if child.log_file is not None else None
            restarted = spawn(child, env, log_dir, colour)
            child.restart_at = None
            child.recovering = True
            _say(f"{child.name} restarted (pid {restarted.pid})")
        elif child.recovering and process.poll() is None and child.is_ready():
            child.recovering = False
            _say(f"{child.name} is ready again")


def _say(message: str) -> None:
    print(f"dev: {message}", file=sys.stderr, flush=True)


def _release_output(child: Child) -> None:
    """Let an exited child's last lines reach the terminal, then close its pipe."""
    process, reader = child.process, child.output_thread
    if reader is not None:
        reader.join(timeout=2)
    if (
        process is not None
        and process.stdout is not None
        and not (reader is not None and reader.is_alive())
    ):
        process.stdout.close()


def stop(children: list[Child], hurry: threading.Event | None = None) -> None:
    """Newest first, so the API and worker finish before the server they talk to goes away.

    Each child gets SIGTERM and its grace period, then SIGKILL; all at once if `hurry` is set.
    """
    for child in reversed(children):
        process = child.process
        if process is None:
            continue
        if process.poll() is None:
            process.terminate()
            deadline = time.monotonic() + child.stop_grace_s
            while process.poll() is None and time.monotonic() < deadline:
                if hurry is not None and hurry.is_set():
                    break
                time.sleep(0.1)
            if process.poll() is None:
                process.kill()
            process.wait()
        _release_output(child)


def main() -> int:
    env = dict(os.environ)
    try:
        children = build_children(env)
    except FileNotFoundError as err:  # the temporal binary: not installed yet
        print(f"dev: {err}", file=sys.stderr)
        return 1
    stopping = threading.Event()
    hurry = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        (hurry if stopping.is_set() else stopping).set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        start(children, env, stopping=stopping)
        # The `outbox` CLI's default API while the stack is up, whatever DEV_API_PORT it has.
        (dev_data_dir(env) / API_URL_FILE).write_text(dev_api_url(env) + "\n")
        print(banner(env), flush=True)
        colour = _use_colour()
        while not stopping.wait(0.5):
            supervise(children, env, colour)
        _say("stopping (Ctrl-C again to kill at once)")
        return 0
    except StartCancelled:
        print("dev: interrupted during start-up; stopping", file=sys.stderr, flush=True)
        return 0
    except StartupError as err:
        print(f"dev: {err}; stopping the stack", file=sys.stderr, flush=True)
        return 1
    finally:
        stop(children, hurry)
        (dev_data_dir(env) / API_URL_FILE).unlink(missing_ok=True)
        print("dev: stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
