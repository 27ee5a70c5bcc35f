"""Keeping the garbage collector's full passes short in the long-running processes.

After start-up the API and the worker hold hundreds of thousands of objects that live as long as
the process (modules, the app, the Temporal client, SQLAlchemy's metadata). Every full
collection walked them all: 110-160 ms pauses that found nothing to free, and each one held
every request in flight (docs/decisions/gc-freeze.md). `gc.freeze()` moves them into the
permanent generation, which collections skip; later objects are collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect once, then freeze what is left: what start-up built, never to be freed. Once per
    process (a test suite builds many apps in one process; only the first start-up freezes)."""
    if gc.get_freeze_count():
        return
    gc.collect()
    gc.freeze()
