"""`make dev`: the whole stack in one terminal — Temporal dev server, fake provider, worker, API.

Each process's output is prefixed with its name. Ctrl-C stops everything (newest first); if any
process dies, the rest are stopped and the exit code says so. Items persist in `.data/`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.settings import PROJECT_ROOT, get_settings
from devstack.temporal_server import dev_server_command

COLOURS = {"temporal": "35", "fake": "36", "worker": "33", "api": "32"}


@dataclass
class Child:
    """One process of the stack, with the check that says it is ready."""

    name: str
    command: list[str]
    ready: Callable[[], bool]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def port_open(port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    return check


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
                return bool(response.status == 200)
        except OSError:
            return False

    return check


def _pipe_output(child: Child) -> None:
    assert child.process is not None and child.process.stdout is not None
    prefix = f"\033[{COLOURS.get(child.name, '0')}m{child.name:>8} |\033[0m "
    for line in iter(child.process.stdout.readline, b""):
        sys.stdout.write(prefix + line.decode(errors="replace"))
        sys.stdout.flush()


def build_children(env: dict[str, str], fake_args: list[str] | None = None) -> list[Child]:
    """The four processes, in start order, configured from DEV_* variables."""
    data_dir = Path(env.get("DEV_DATA_DIR", str(PROJECT_ROOT / ".data")))
    temporal_port = int(env.get("DEV_TEMPORAL_PORT", "7233"))
    ui_port = int(env.get("DEV_UI_PORT", "8233"))
    fake_port = int(env.get("DEV_FAKE_PORT", "8025"))
    api_port = int(env.get("DEV_API_PORT", "8000"))
    python = sys.executable
    env.setdefault("TEMPORAL_ADDRESS", f"127.0.0.1:{temporal_port}")
    env.setdefault("FAKE_PROVIDER_URL", f"http://127.0.0.1:{fake_port}")
    env.setdefault("DATABASE_URL", f"sqlite:///{data_dir / 'readmodel.db'}")
    return [
        Child(
            "temporal",
            dev_server_command(data_dir / "temporal.db", port=temporal_port, ui_port=ui_port),
            port_open(temporal_port),
        ),
        Child(
            "fake",
            [python, "-m", "devstack.fake_provider", "--port", str(fake_port), *(fake_args or [])],
            port_open(fake_port),
        ),
        Child("worker", [python, str(PROJECT_ROOT / "worker.py")], lambda: True),
        Child(
            "api",
            [python, "-m", "uvicorn", "api.main:create_app", "--factory", "--port", str(api_port)],
            http_ok(f"http://127.0.0.1:{api_port}/healthz"),
        ),
    ]


def banner(env: dict[str, str]) -> str:
    api = f"http://127.0.0.1:{env.get('DEV_API_PORT', '8000')}"
    ui = f"http://127.0.0.1:{env.get('DEV_UI_PORT', '8233')}"
    auth = "bearer token required" if get_settings().api_tokens else "OPEN: no API_TOKEN set"
    return f"""
  durable-outbox is up
    API               {api}   ({auth})
    OpenAPI docs      {api}/docs
    Dashboard         {api}/
    Temporal Web UI   {ui}
    Fake provider     {env["FAKE_PROVIDER_URL"]}   (stats: /_admin/stats)

  Try:
    curl -s -X POST {api}/v1/outboxes/demo/items -H 'Content-Type: application/json' \\
      -H 'Idempotency-Key: hello-1' \\
      -d '{{"destination": "fake-webhook", "payload": {{"hello": "world"}}}}'
    curl -s {api}/v1/outboxes/demo/items/hello-1

  Ctrl-C stops everything; items persist in .data/.
"""


def start(children: list[Child], env: dict[str, str], log_dir: Path | None = None) -> None:
    """Start each child and wait until it is ready; raises RuntimeError naming the one that fails.

    Output goes to the terminal with a name prefix, or to `log_dir/<name>.log` when given.
    """
    for child in children:
        if log_dir is None:
            output: Any = subprocess.PIPE
        else:
            log_dir.mkdir(parents=True, exist_ok=True)
            output = (log_dir / f"{child.name}.log").open("ab")
        child.process = subprocess.Popen(
            child.command,
            cwd=PROJECT_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        )
        if log_dir is not None:
            output.close()  # the child has its own copy of the descriptor
        if log_dir is None:
            threading.Thread(target=_pipe_output, args=(child,), daemon=True).start()
        deadline = time.monotonic() + 60
        while not child.ready():
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} not ready after 60 s")
            time.sleep(0.2)


def main() -> int:
    env = dict(os.environ)
    children = build_children(env)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        start(children, env)
        print(banner(env), flush=True)
        while not stopping.is_set():
            for child in children:
                assert child.process is not None
                if child.process.poll() is not None:
                    code = child.process.returncode
                    print(f"{child.name} exited with {code}; stopping", file=sys.stderr)
                    return 1
            stopping.wait(0.5)
        return 0
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    finally:
        stop(children)


def stop(children: list[Child]) -> None:
    """Newest first, so the API and worker finish before the server they talk to goes away."""
    for child in reversed(children):
        if child.process is None or child.process.poll() is not None:
            continue
        child.process.terminate()
        try:
            child.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


if __name__ == "__main__":
    sys.exit(main())
