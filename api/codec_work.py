"""The codec server's work (parse, base64, AES-GCM, serialise) in processes of its own.

Run on a thread of the API process, a request at the cap still held ordinary requests back: the
large C calls in parsing and encryption hold the GIL, and the event loop waited for it (GET p99
of about 270 ms while codec requests at the cap ran, `bench/bounded_load.py`). In a process of
its own the work competes with the event loop for a core at most, never for its GIL.

`CodecWorkers` starts its processes (`CODEC_PROCESSES`) on the first codec request, so an API
that never serves the Web UI never starts one. Each rebuilds the codec from its keys
(`EncryptionCodec` pickles as its keys). What a request did wrong comes back as an `Outcome`,
never as an exception to pickle, and the route answers it as a problem.
"""

from __future__ import annotations

import asyncio
import base64
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from durable_outbox_temporal.codec import CodecKeyError
from google.protobuf.message import DecodeError
from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload

Direction = Literal["encode", "decode"]


class Codec(Protocol):
    async def encode(self, payloads: list[Payload]) -> list[Payload]: ...

    async def decode(self, payloads: list[Payload]) -> list[Payload]: ...


class JsonPayload(BaseModel):
    """A payload as the Web UI's codec protocol sends it: base64 metadata values and data."""

    metadata: dict[str, str] = {}
    data: str = ""


class Payloads(BaseModel):
    payloads: list[JsonPayload]


@dataclass(frozen=True)
class Outcome:
    """What one request came to: the answer's body, or a problem (`status`, `code`, `detail`),
    or the body's validation errors (`invalid`) for the API's usual 400/422 answer."""

    body: bytes = b""
    status: int = 200
    code: str = ""
    detail: str = ""
    invalid: tuple[dict[str, Any], ...] = ()


class CodecWorkers:
    """A pool of processes doing the codec's work for one API process."""

    def __init__(self, codec: Codec | None, processes: int) -> None:
        self._codec = codec
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, raw: bytes, direction: Direction, most: int) -> Outcome:
        """`raw` (a request body) encoded or decoded, in one of the pool's processes."""
        if self._pool is None:
            # Spawned, not forked: the API process runs threads (the SDK's, the event loop's
            # helpers), and a fork copies their locks in whatever state they are in.
            self._pool = ProcessPoolExecutor(
                self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=(self._codec,),
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, work, raw, direction, most)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


# The codec of this pool process, set once as it starts.
_codec: Codec | None = None


# How often a pool process checks that the API process that started it is still there.
PARENT_CHECK_S = 1.0


def _start(codec: Codec | None) -> None:
    global _codec
    _codec = codec
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()


def _exit_with(parent: int) -> None:
    """End this pool process once the API process that started it is gone. An API that ends
    without its lifespan's close (SIGKILLed, or a process that leaves with `os._exit`) would
    otherwise leave it behind for good: found as orphans after test runs, one per run."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def work(raw: bytes, direction: Direction, most: int, codec: Codec | None = None) -> Outcome:
    """Parse, check the count, transform, serialise. The codec's coroutines do CPU work only and
    never await I/O, so they run to completion in a loop of their own."""
    codec = codec if codec is not None else _codec
    try:
        body = Payloads.model_validate_json(raw)
    except ValidationError as err:
        return Outcome(status=422, invalid=tuple(_plain(error) for error in err.errors()))
    if len(body.payloads) > most:
        return Outcome(
            status=413,
            code="too-many-payloads",
            detail=f"{len(body.payloads)} payloads in one request; at most {most}"
            " (CODEC_MAX_PAYLOADS)",
        )
    try:
        payloads = [
            Payload(
                metadata={k: base64.b64decode(v) for k, v in p.metadata.items()},
                data=base64.b64decode(p.data),
            )
            for p in body.payloads
        ]
    except ValueError as err:
        return Outcome(status=400, code="bad-payload", detail=f"not base64: {err}")
    if codec is not None:
        transform = codec.encode if direction == "encode" else codec.decode
        try:
            payloads = asyncio.run(transform(payloads))
        except CodecKeyError as err:
            return Outcome(status=422, code="undecodable-payload", detail=str(err))
        except (ValueError, DecodeError) as err:
            # A key id that is not UTF-8, a ciphertext too short to hold a nonce, plaintext
            # that is no payload: what a hand-made request holds, never what our codec wrote.
            return Outcome(
                status=422,
                code="undecodable-payload",
                detail=f"not a payload this codec wrote ({type(err).__name__})",
            )
    answer = Payloads(
        payloads=[
            JsonPayload(
                metadata={k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                data=base64.b64encode(p.data).decode(),
            )
            for p in payloads
        ]
    )
    return Outcome(body=answer.model_dump_json().encode())


def _plain(error: Any) -> dict[str, Any]:
    """A validation error as plain data that pickles (its `ctx` may hold an exception)."""
    return {
        "type": error["type"],
        "loc": ("body", *error["loc"]),
        "msg": error["msg"],
        "input": error.get("input") if isinstance(error.get("input"), str | int | float) else None,
    }
