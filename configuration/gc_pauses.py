"""Keeping the garbage collector's full passes short in the long-running processes.

After start-up the API and the worker hold hundreds of thousands of objects that live as long as
the process (modules, the app, the Temporal client, SQLAlchemy's metadata). Every full
collection walked them all: 110-160 ms pauses that found nothing to free, and each one held
every request in flight (docs/decisions/gc-freeze.md). `gc.freeze()` moves them into the
permanent generation, which collections skip; later objects are collected as before.
"""

from __future__ import annotations

import gc

# Whether this process froze already. Not `gc.get_freeze_count()`: that counts the frozen objects
# by walking them all (CPython 3.11), and a test process that builds hundreds of apps spent 28 s
# of CPU in it over the suite (py-spy, 2026-11-28).
_frozen = False


def freeze_startup_heap() -> None:
    """Collect once, then freeze what is left: what start-up built, never to be freed. Once per
    process (a test suite builds many apps in one process; only the first start-up freezes)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
