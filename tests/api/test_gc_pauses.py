"""The long-running processes freeze what start-up built, so the collector's full passes skip it
(docs/decisions/gc-freeze.md): a pass over the API's start-up heap held every request in flight
for 110-160 ms."""

from __future__ import annotations

import gc
import subprocess
import sys

from tests.api.conftest import Api


async def test_the_api_freezes_its_start_up_heap(api: Api) -> None:
    assert (await api.http.get("/healthz")).status_code == 200

    assert gc.get_freeze_count() > 10_000


def test_the_heap_is_frozen_once_per_process() -> None:
    script = (
        "import gc\n"
        "from configuration.gc_pauses import freeze_startup_heap\n"
        "freeze_startup_heap()\n"
        "first = gc.get_freeze_count()\n"
        "kept = [[n] for n in range(50_000)]\n"
        "freeze_startup_heap()\n"
        "print(first > 0, gc.get_freeze_count() == first)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )

    assert done.stdout.split() == ["True", "True"]
