"""Free loopback ports for the servers tests start as processes.

A port the kernel hands out for `bind(("127.0.0.1", 0))` comes from its ephemeral range, the
range every outgoing connection takes its local port from too. Picked a while before the server
binds it (at import, or before a process starts), such a port was seen taken by then: CI lost a
whole test process's dev server to "bind: address already in use" on its Web UI port, and every
test of that process that needed the server with it. A port below the ephemeral range is never
taken by an outgoing connection.

Another test's server could still take it: a port is free when picked and bound seconds later,
once the process that serves it is up (a dev stack's worker binds its metrics port last), and
`make test` runs several test processes at once, each picking ports at random from one range. CI
lost the README tour's test to its worker's metrics port, taken in that window. So each port
handed out is also reserved, for every process of the user on the machine, by a file created
exclusively in a directory they all share, and no process hands it out again while the
reservation is younger than `RESERVATION_S`: longer than any test holds a server it started.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

_FALLBACK_EPHEMERAL_LOW = 32768
_LOWEST = 20000
RESERVATION_S = 30 * 60
# One directory per user: another user's would not let this one create files in it.
RESERVATIONS = Path(tempfile.gettempdir()) / f"durable-outbox-test-ports-{os.getuid()}"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def _reserve(port: int, directory: Path) -> bool:
    """Whether this process now holds `port`'s reservation (it was free, or stale and retaken)."""
    path = directory / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime < RESERVATION_S:
                    return False
                # A stale reservation: whoever made it is long done. Another process may be
                # retaking it at the same moment; only one of them creates the file again.
                path.unlink()
            except FileNotFoundError:
                pass
    return False


def free_port(reservations: Path = RESERVATIONS) -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range, and handed out
    by no other call (in any process using `reservations`) for the last `RESERVATION_S`."""
    reservations.mkdir(parents=True, exist_ok=True)
    high = _ephemeral_low() - 1
    for _ in range(500):
        port = random.randint(_LOWEST, high)
        if not _reserve(port, reservations):
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {_LOWEST} and {high}")
