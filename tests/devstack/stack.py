"""`python -m devstack.dev` as a user runs it, on free ports and a data directory of its own: the
dev stack end-to-end tests and the README tour's test start it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BANNER = "durable-outbox is up"


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class DevStack:
    """`python -m devstack.dev` as a user runs it, on free ports and a data directory of its own."""

    def __init__(self, data_dir: Path) -> None:
        self.ports = {
            name: free_port() for name in ("DEV_TEMPORAL_PORT", "DEV_UI_PORT", "DEV_FAKE_PORT")
        }
        self.ports["DEV_API_PORT"] = free_port()
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"API_TOKEN", "DATABASE_URL", "TEMPORAL_ADDRESS", "FAKE_PROVIDER_URL"}
        }
        self.env.update({name: str(port) for name, port in self.ports.items()})
        self.env.update(
            DEV_DATA_DIR=str(data_dir),
            WORKER_METRICS_ADDRESS=f"127.0.0.1:{free_port()}",
            NO_COLOR="1",
        )
        self.api = f"http://127.0.0.1:{self.ports['DEV_API_PORT']}"
        self.temporal = f"127.0.0.1:{self.ports['DEV_TEMPORAL_PORT']}"
        self.fake = f"http://127.0.0.1:{self.ports['DEV_FAKE_PORT']}"
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self.reader = threading.Thread()

    def start(self, timeout_s: float = 120) -> None:
        self.lines.clear()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devstack.dev"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + timeout_s
        while not any(BANNER in line for line in self.lines):
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.2)

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines[-60:])

    def children(self) -> dict[str, int]:
        """The stack's processes by name, from the kernel's list of dev.py's children."""
        assert self.process is not None
        pid = self.process.pid
        found: dict[str, int] = {}
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for name, marker in (
                ("temporal", "server start-dev"),
                ("fake", "devstack.fake_provider"),
                ("worker", "worker.py"),
                ("api", "api.main:create_app"),
            ):
                if marker in command:
                    found[name] = int(child)
        return found

    def wait(self, timeout_s: float = 90) -> int:
        assert self.process is not None and self.process.stdout is not None
        code = self.process.wait(timeout=timeout_s)
        self.reader.join(timeout=5)
        self.process.stdout.close()
        return code

    def stop(self) -> int | None:
        """SIGTERM the stack if it still runs (as Ctrl-C would) and wait; its exit code. A
        stack that does not stop in time is SIGKILLed, its processes first (each runs in a
        session of its own, so killing dev.py alone would leave them running), and the
        timeout raised: a test that failed on a loaded machine once left its whole stack
        running for good, holding its ports."""
        if self.process is None or self.process.poll() is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.wait()
        except subprocess.TimeoutExpired:
            for pid in self.children().values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.wait()
            raise
