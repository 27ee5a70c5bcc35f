"""Free loopback ports for the servers tests start as processes.

A port the kernel hands out for `bind(("127.0.0.1", 0))` comes from its ephemeral range, the
range every outgoing connection takes its local port from too. Picked a while before the server
binds it (at import, or before a process starts), such a port was seen taken by then: CI lost a
whole test process's dev server to "bind: address already in use" on its Web UI port, and every
test of that process that needed the server with it. A port below the ephemeral range is never
taken by an outgoing connection; only another server could take it, and each test picks its own
at random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FALLBACK_EPHEMERAL_LOW = 32768
_LOWEST = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range."""
    high = _ephemeral_low() - 1
    for _ in range(200):
        port = random.randint(_LOWEST, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {_LOWEST} and {high}")
