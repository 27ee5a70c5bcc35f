"""`make chaos` (QUICK=1 for the short run): the API's bounds under load, on loopback only.

Starts its own stack (dev server, fake provider, worker, API with three tokens) on ports clear
of `make dev`, `make bench` and the other chaos runs, then, while a prober times an ordinary GET
(`GET /v1/outboxes`) every 20 ms:

- opens live sockets up to `LIVE_SOCKETS_PER_TOKEN` for one token and past it, then up to
  `LIVE_SOCKETS_MAX` for the process and past it (each past the limit must be refused 429), and
  holds them open for the rest of the run, each on an outbox of its own;
- sends codec requests at the cap (`CODEC_MAX_PAYLOADS` payloads, just under
  `CODEC_MAX_REQUEST_BYTES`), encode and decode, and one past each cap (413);
- enqueues to LOAD_OUTBOXES outbox names, then counts the `outbox` label values `/metrics`
  exports (at most `METRICS_OUTBOX_LABELS`, plus `other` and `(unknown)`).

Each phase runs alone, one after the other (the codec pool's start, the codec at its cap, the
enqueues), then the codec and the enqueues together; the GET's p99 is reported per phase
(`p99_ms_codec`, `p99_ms_enqueues`, `p99_ms_codec_and_enqueues`, ...). Exits 1 if the GET's p99
reaches 100 ms in any phase (docs/decisions/codec-off-the-loop.md, docs/decisions/gc-freeze.md),
or any bound does not hold.
Bounded in count (the figures above) and time (LOAD_DEADLINE_S for the whole load). Writes
`.bench/bounded-load.json`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import shutil
import ssl
import statistics
import sys
import threading
import time
from typing import Any

import httpx
import websockets
from prometheus_client.parser import text_string_to_metric_families

from bench.run import machine
from configuration.settings import PROJECT_ROOT
from devstack.dev import StartupError, build_children, start, stop

QUICK = os.environ.get("QUICK") == "1"
OUTBOXES = int(os.environ.get("LOAD_OUTBOXES") or (150 if QUICK else 500))
CODEC_REQUESTS = 4 if QUICK else 12
DEADLINE_S = float(os.environ.get("LOAD_DEADLINE_S") or 300)
P99_LIMIT_MS = 100.0
PROBE_EVERY_S = 0.02
TOKENS = ("load-a", "load-b", "load-c")
PER_TOKEN, PROCESS_MAX = 40, 100
CODEC_PAYLOADS, CODEC_BYTES = 1000, 4 * 1024 * 1024
OUTBOX_LABELS = 50
LOAD_DIR = PROJECT_ROOT / ".bench" / "bounded-load"
LOG_DIR = LOAD_DIR / "logs"
REPORT_PATH = PROJECT_ROOT / ".bench" / "bounded-load.json"
API_PORT = 8030
SETTINGS = {
    "DEV_TEMPORAL_PORT": "7263",
    "DEV_UI_PORT": "8263",
    "DEV_API_PORT": str(API_PORT),
    "DEV_FAKE_PORT": "8035",
    "DEV_FAKE_REPORTS": "0",
    "WORKER_METRICS_ADDRESS": "127.0.0.1:9494",
    "API_TOKEN": ",".join(TOKENS),
    "LIVE_SOCKETS_PER_TOKEN": str(PER_TOKEN),
    "LIVE_SOCKETS_MAX": str(PROCESS_MAX),
    "CODEC_MAX_PAYLOADS": str(CODEC_PAYLOADS),
    "CODEC_MAX_REQUEST_BYTES": str(CODEC_BYTES),
    "METRICS_OUTBOX_LABELS": str(OUTBOX_LABELS),
}
API = f"http://127.0.0.1:{API_PORT}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Prober:
    """Times `GET /v1/outboxes` every PROBE_EVERY_S until stopped, on a thread of its own, so
    that the load's waits are not the probe's. The thread shares this process's GIL with the
    load: what holds it long (the 4 MiB body, the TLS context) is made before the probing."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        # When each probe started (monotonic), to split the figures by phase.
        self.started: list[float] = []
        self.failures: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=API, headers=bearer(TOKENS[0])) as http:
            while not self.stopped.is_set():
                began = time.perf_counter()
                self.started.append(time.monotonic())
                try:
                    response = http.get("/v1/outboxes")
                    if response.status_code != 200:
                        self.failures.append(f"HTTP {response.status_code}")
                except httpx.HTTPError as err:
                    self.failures.append(type(err).__name__)
                self.latencies_ms.append((time.perf_counter() - began) * 1000)
                self.stopped.wait(PROBE_EVERY_S)

    def p99_ms(self, since: float = 0.0, until: float = float("inf")) -> float:
        """The 99th percentile of the probes started in [since, until)."""
        picked = [
            latency
            for started, latency in zip(self.started, self.latencies_ms, strict=True)
            if since <= started < until
        ]
        # Inclusive: a phase has tens of probes, and the default method would put the p99 above
        # the slowest probe seen.
        if len(picked) < 2:
            return 0.0
        return round(statistics.quantiles(picked, n=100, method="inclusive")[98], 1)


async def open_socket(sockets: contextlib.AsyncExitStack, token: str, n: int) -> int | None:
    """Open a live socket on an outbox of its own; None when open, else the refusal's status."""
    url = API.replace("http://", "ws://") + f"/v1/outboxes/live-load-{n}/live"
    try:
        await sockets.enter_async_context(
            websockets.connect(url, additional_headers=bearer(token), open_timeout=30)
        )
    except websockets.InvalidStatus as err:
        return err.response.status_code
    return None


async def sockets_phase(sockets: contextlib.AsyncExitStack) -> dict[str, Any]:
    """Up to the token's limit and past it, then up to the process's and past it."""
    refused_token = [await open_socket(sockets, TOKENS[0], n) for n in range(PER_TOKEN + 5)]
    rest = [
        await open_socket(sockets, TOKENS[1 + n % 2], PER_TOKEN + 5 + n)
        for n in range(PROCESS_MAX - PER_TOKEN + 10)
    ]
    return {
        "token_opened": refused_token.count(None),
        "token_refused_429": refused_token.count(429),
        "process_opened": refused_token.count(None) + rest.count(None),
        "process_refused_429": rest.count(429),
    }


def codec_body(count: int, raw_bytes: int) -> dict[str, Any]:
    data = base64.b64encode(os.urandom(raw_bytes)).decode()
    return {"payloads": [{"metadata": {}, "data": data} for _ in range(count)]}


async def declared_size_status(path: str, size: int, token: str) -> int:
    """The status a POST declaring a `size`-byte body gets before any of it is sent: the API
    refuses by `Content-Length` and closes, so a client still writing would see a reset."""
    reader, writer = await asyncio.open_connection("127.0.0.1", API_PORT)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
    finally:
        writer.close()
    return int(status_line.split()[1])


@functools.cache
def tls() -> ssl.SSLContext:
    """The load's clients' one TLS context, made before the probing starts: each client made
    with a context of its own loads the CA bundle holding this process's GIL (20 to 70 ms),
    which the prober's thread waited out."""
    return ssl.create_default_context()


def client(token: str, timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=API, headers=bearer(token), timeout=timeout, verify=tls())


@functools.cache
def at_cap_body() -> str:
    """A codec request just under the byte cap with the JSON around each payload. Built once,
    before the probing starts: serialising its 4 MiB holds this process's GIL for a tenth of a
    second, which the prober's thread waited out (a probe of 120-130 ms at the start of each
    codec phase, counted as the API's)."""
    return json.dumps(codec_body(CODEC_PAYLOADS, int(CODEC_BYTES / CODEC_PAYLOADS * 0.68)))


async def codec_phase() -> dict[str, Any]:
    """Requests at the cap, encode then decode, and one past each cap."""
    # The answers are passed on as they came, so the load's client spends little time on JSON.
    at_cap = at_cap_body()
    statuses: list[int] = []
    json_type = {"Content-Type": "application/json"}
    async with client(TOKENS[2], timeout=60) as http:
        for _ in range(CODEC_REQUESTS // 2):
            encoded = await http.post("/codec/encode", content=at_cap, headers=json_type)
            statuses.append(encoded.status_code)
            decoded = await http.post("/codec/decode", content=encoded.content, headers=json_type)
            statuses.append(decoded.status_code)
        too_many = await http.post("/codec/encode", json=codec_body(CODEC_PAYLOADS + 1, 8))
    too_big = await declared_size_status("/codec/encode", CODEC_BYTES + 1, TOKENS[2])
    return {
        "request_bytes": len(at_cap),
        "at_cap_ok": statuses.count(200),
        "at_cap_sent": len(statuses),
        "too_many_status": too_many.status_code,
        "too_big_status": too_big,
    }


async def enqueue_phase(first: int) -> dict[str, Any]:
    """One item into each of OUTBOXES outbox names from the `first`'s, ten at a time; then
    the label values."""
    gate = asyncio.Semaphore(10)
    async with client(TOKENS[1], timeout=30) as http:

        async def enqueue(n: int) -> int:
            async with gate:
                response = await http.post(
                    f"/v1/outboxes/tenant-{n}/items",
                    json={"destination": "fake-webhook", "payload": {"n": n}},
                    headers={"Idempotency-Key": f"load-{n}"},
                )
                return response.status_code

        statuses = await asyncio.gather(*(enqueue(n) for n in range(first, first + OUTBOXES)))
        scraped = await http.get("/metrics")
    labels = {
        sample.labels["outbox"]
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
        if "outbox" in sample.labels
    }
    return {
        "enqueued": statuses.count(202),
        "outbox_names": OUTBOXES,
        "outbox_label_values": len(labels),
    }


async def load() -> dict[str, Any]:
    # Made now, not in a phase: either holds this process's GIL long enough to hold the
    # prober's thread back.
    tls()
    at_cap_body()
    prober = Prober()
    probing = asyncio.create_task(asyncio.to_thread(prober.run))
    began = time.monotonic()
    async with contextlib.AsyncExitStack() as sockets:
        figures = {"sockets": await sockets_phase(sockets)}
        # With every socket held open, one after the other, so each one's effect on the GETs
        # is seen alone: the codec pool's start (one small request), the codec at its cap,
        # the enqueues to new outbox names; then the last two side by side.
        windows = {"opening_sockets": (began, time.monotonic())}
        started = time.monotonic()
        await codec_warm_up()
        windows["codec_pool_start"] = (started, time.monotonic())
        started = time.monotonic()
        figures["codec"] = await codec_phase()
        windows["codec"] = (started, time.monotonic())
        started = time.monotonic()
        figures["enqueue"] = await enqueue_phase(first=0)
        windows["enqueues"] = (started, time.monotonic())
        started = time.monotonic()
        await asyncio.gather(codec_phase(), enqueue_phase(first=OUTBOXES))
        windows["codec_and_enqueues"] = (started, time.monotonic())
    prober.stopped.set()
    await probing
    figures["probe"] = {
        "requests": len(prober.latencies_ms),
        "failures": len(prober.failures),
        "p50_ms": round(statistics.median(prober.latencies_ms), 1),
        "p99_ms": prober.p99_ms(),
        **{f"p99_ms_{name}": prober.p99_ms(*window) for name, window in windows.items()},
        "max_ms": round(max(prober.latencies_ms), 1),
    }
    return figures


async def codec_warm_up() -> None:
    """One small encode: the first codec request of the process starts its pool."""
    async with client(TOKENS[2], timeout=60) as http:
        response = await http.post("/codec/encode", json=codec_body(1, 8))
        response.raise_for_status()


def problems(figures: dict[str, Any]) -> list[str]:
    """Every bound that did not hold."""
    found = []
    sockets, codec, enqueue, probe = (
        figures[name] for name in ("sockets", "codec", "enqueue", "probe")
    )
    if (sockets["token_opened"], sockets["token_refused_429"]) != (PER_TOKEN, 5):
        found.append(f"per-token limit: {sockets}")
    if (sockets["process_opened"], sockets["process_refused_429"]) != (PROCESS_MAX, 10):
        found.append(f"per-process limit: {sockets}")
    if codec["at_cap_ok"] != codec["at_cap_sent"]:
        found.append(f"codec requests at the cap failed: {codec}")
    if (codec["too_many_status"], codec["too_big_status"]) != (413, 413):
        found.append(f"codec requests past the cap not refused: {codec}")
    if enqueue["enqueued"] != OUTBOXES:
        found.append(f"enqueues failed: {enqueue}")
    if enqueue["outbox_label_values"] > OUTBOX_LABELS + 2:
        found.append(f"outbox label values unbounded: {enqueue}")
    if probe["failures"]:
        found.append(f"{probe['failures']} probe GETs failed")
    for phase, what in (
        ("opening_sockets", "sockets open"),
        ("codec_pool_start", "the codec's pool starts"),
        ("codec", "codec requests run"),
        ("enqueues", "enqueues to new outbox names run"),
        ("codec_and_enqueues", "codec requests and enqueues run"),
    ):
        if probe[f"p99_ms_{phase}"] >= P99_LIMIT_MS:
            found.append(
                f"GET p99 {probe[f'p99_ms_{phase}']} ms while {what}, not under {P99_LIMIT_MS} ms"
            )
    return found


async def run(env: dict[str, str]) -> dict[str, Any]:
    children = build_children(env)
    stopping = threading.Event()
    try:
        await asyncio.to_thread(start, children, env, LOG_DIR, stopping)
        print("stack up; loading the API", flush=True)
        return await asyncio.wait_for(load(), DEADLINE_S)
    finally:
        stopping.set()
        await asyncio.to_thread(stop, children)


def main() -> int:
    began = time.monotonic()
    data_dir = LOAD_DIR / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {**os.environ, **SETTINGS, "DEV_DATA_DIR": str(data_dir)}
    env["DATABASE_URL"] = f"sqlite:///{data_dir / 'readmodel.db'}"
    info = {**machine(), "mode": "quick" if QUICK else "full"}
    print(f"machine: {info}", flush=True)
    try:
        figures = asyncio.run(run(env))
    except StartupError as err:
        print(f"bounded load: {err} (see {LOG_DIR})", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"bounded load: not done within {DEADLINE_S} s", file=sys.stderr)
        return 1
    found = problems(figures)
    report = {"machine": info, **figures, "runtime_s": round(time.monotonic() - began, 1)}
    report |= {"passed": not found, "problems": found}
    REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    REPORT_PATH.write_text(json.dumps(report, indent=2))
    for name in ("sockets", "codec", "enqueue", "probe"):
        print(f"{name:>8}: {figures[name]}")
    print("\n".join(f"PROBLEM: {problem}" for problem in found) or "every bound held")
    print(f"written to {REPORT_PATH}; logs in {LOG_DIR}")
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
