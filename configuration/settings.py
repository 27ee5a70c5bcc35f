"""Process settings, read once from the environment (and `.env`), shared by worker, API and CLI."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from durable_outbox_temporal.contract.ids import OPERATIONS_TASK_QUEUE, WORKFLOW_TASK_QUEUE
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# `fake-email`'s events secret in config/destinations.toml unless FAKE_EMAIL_EVENTS_SECRET is set
# (`make dev`'s): published here, so a production API refuses to take reports with it.
DEV_EVENTS_SECRET = "dev-events-secret"
PUBLIC_EVENTS_SECRETS = frozenset({DEV_EVENTS_SECRET})
# The fake provider's credentials, config/destinations.toml's fallbacks unless FAKE_ACS_ACCESS_KEY,
# FAKE_WEBHOOK_SECRET and FAKE_PAYMENT_TOKEN are set: published here, so no production process
# signs with them.
PUBLIC_ACS_ACCESS_KEY = "ZmFrZS1hY3MtYWNjZXNzLWtleQ=="
PUBLIC_WEBHOOK_SECRET = "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"
PUBLIC_PAYMENT_TOKEN = "sk_test_fake_payment_token"
# The seed examples (`examples/`), registered like any type of one's own.
SEED_AGGREGATE_TYPES = "examples.flight:FLIGHT,examples.labour:LABOUR,examples.lock:LOCK"


class Settings(BaseSettings):
    """Configuration of every durable-outbox process. Each field is an env var of the same name.

    The Temporal connection is not here: it follows Temporal's own standard (`TEMPORAL_ADDRESS`,
    `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS_*`, profiles), read by
    `durable_outbox_temporal.connect`.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    workflow_task_queue: str = Field(
        default=WORKFLOW_TASK_QUEUE,
        description="Task queue of the item, lane and aggregate workflows.",
    )
    operations_task_queue: str = Field(
        default=OPERATIONS_TASK_QUEUE,
        description="Task queue of the operations worker: scheduled fan-out, redrive batches,"
        " aggregate effects, projector runners.",
    )
    outbox_config: Path = Field(
        default=PROJECT_ROOT / "config" / "destinations.toml",
        description="The destinations file (TOML): where items go, how fast, how hard to try.",
    )
    database_url: str = Field(
        default=f"sqlite:///{PROJECT_ROOT / '.data' / 'readmodel.db'}",
        description="The read model's database: `sqlite:///path` or `postgresql://...`.",
    )
    aggregate_types: str = Field(
        default=SEED_AGGREGATE_TYPES,
        description="The aggregate types served, comma-separated, each `module:attribute`"
        " naming an aggregate definition (an instance or its class) or an `AggregateType` with"
        " its read models; the module must be importable (`PYTHONPATH`). An entry that does not"
        " load stops the worker and the API at start-up. Default: the three seed examples.",
    )

    outbox_env: Literal["development", "production"] = Field(
        default="development",
        description="`production` (the image's default): the API refuses to start without a"
        " token, and the API and the worker without payload keys or with a public development"
        " credential (events secret, access key, webhook secret), unless `ALLOW_INSECURE` is set.",
    )
    allow_insecure: bool = Field(
        default=False,
        description="Let a `production` API or worker start with an open configuration anyway;"
        " it then warns on every start and `/readyz` lists what is open.",
    )
    allowed_hosts: str = Field(
        default="*",
        description="Host names the API answers to (`Host` header), comma-separated, e.g."
        " `outbox.example.com`; `*`: any (set it in production against DNS rebinding).",
    )
    public_base_url: str = Field(
        default="",
        description="The API's public URL (`https://outbox.example.com`), making each problem's"
        " `type` an absolute link to its page; empty: relative (`/problems/<code>`).",
    )
    websocket_origins: str = Field(
        default="",
        description="Browser origins, besides the API's own, whose pages may open the live"
        " WebSockets, comma-separated (`https://ops.example.com`).",
    )
    session_secret: str = Field(
        default="",
        description="Key that signs the Web UI's codec session cookie; give every API process"
        " behind one host the same one. Empty: a random key per process.",
    )
    api_token: str = Field(
        default="",
        description="Bearer tokens with every scope, comma-separated; with neither this nor"
        " `API_TOKENS_FILE` set, the API runs open.",
    )
    # A TOML file of scoped tokens (their SHA-256, scopes and outboxes; see api/auth.py and
    # docs/how-to/security.md); empty: none.
    api_tokens_file: str = Field(
        default="",
        description="TOML file of scoped tokens, each stored as its SHA-256 with its scopes and"
        " outboxes; empty: none.",
    )
    replay_confirm_over: int = Field(
        default=1000,
        ge=0,
        description="A replay selecting more items than this is refused (409, with the count)"
        " unless its `confirm_count` is the number its filter selects.",
    )
    # The transactional outbox's relay (`service.relay`): run inside each worker process that
    # runs workflows; how often it polls (PostgreSQL also wakes it on commit); how long relayed
    # rows are kept.
    relay_enabled: bool = Field(
        default=True,
        description="Run the transactional outbox's relay in each worker process that runs"
        " workflows.",
    )
    relay_poll_interval_s: float = Field(
        default=0.25,
        gt=0,
        description="How often the relay polls for committed rows, in seconds (PostgreSQL also"
        " wakes it on commit).",
    )
    relay_retention_s: float = Field(
        default=7 * 24 * 3600.0, ge=0, description="How long relayed rows are kept, in seconds."
    )
    metrics_token_required: bool = Field(
        default=True,
        description="With API tokens configured, `/metrics` needs a bearer token holding the"
        " `metrics` scope (401 without one). `false` lets Prometheus scrape without one (a token"
        " sent is checked all the same) and is listed under `insecure` in `/readyz`.",
    )
    retention_interval_s: float = Field(
        default=3600.0,
        ge=60,
        le=7 * 24 * 3600,
        description="How often the retention schedule starts a run that prunes ended items'"
        " payloads and rows past their destination's retention, in seconds"
        " (docs/how-to/retention.md).",
    )
    relay_max_attempts: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Tries of a relay row that keeps failing (anything but a refusal), one"
        " lease apart, before it is refused with its error and its key goes on.",
    )
    # Claim checks: a payload above this many bytes (after encryption) is stored once in the
    # database (`payload_blobs`) and the workflow history carries a reference; 0 turns it off
    # (payloads then stay under Temporal's own payload size limit, about 2 MB).
    claim_check_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        description="A payload above this many bytes (after encryption) is stored once in the"
        " database and the workflow history carries a reference; 0: off (a worker that runs"
        " workflows refuses it while a destination is in bulk mode).",
    )
    # Payload encryption keys, `key-id:base64,...`, the first one current (see
    # durable_outbox_temporal/codec.py, which every Temporal client reads them with,
    # `durable_outbox_temporal.connect` included); empty: payloads in plain text.
    payload_keys: str = Field(
        default="",
        description="Payload encryption keys, `key-id:base64,...`, the first one current; empty:"
        " payloads in plain text.",
    )
    codec_cors_origins: str = Field(
        default="http://127.0.0.1:8233,http://localhost:8233",
        description="Browser origins allowed to call the API (the Web UI calling the codec"
        " server), comma-separated.",
    )
    cancel_wait_s: float = Field(
        default=5.0,
        description="How long a cancel waits for a worker before it is recorded as a signal"
        " (202), in seconds.",
    )
    max_request_bytes: int = Field(
        default=10 * 1024 * 1024,
        description="Largest accepted request body, in bytes (413 above it).",
    )
    # Bounds on what one caller can make the API hold or do (docs/how-to/security.md).
    codec_max_payloads: int = Field(
        default=1000,
        ge=1,
        description="Most payloads one `/codec/encode` or `/codec/decode` request may carry"
        " (413 above it).",
    )
    codec_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes that do `/codec/` work beside the API process, started on the"
        " first codec request: its parsing and encryption never hold the API's event loop.",
    )
    codec_max_request_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="Largest `/codec/` request body, in bytes (413 above it); below"
        " `MAX_REQUEST_BYTES`, which bounds every other route.",
    )
    live_sockets_max: int = Field(
        default=500,
        ge=1,
        description="Live sockets (`/live`) one API process holds open at once; one more is"
        " refused (HTTP 429 before the handshake, with `Retry-After`).",
    )
    live_sockets_per_token: int = Field(
        default=20,
        ge=1,
        description="Live sockets one token (or, with no tokens configured, one client address)"
        " holds open at once in one API process; one more is refused like a full process.",
    )
    metrics_outbox_labels: int = Field(
        default=50,
        ge=0,
        le=10_000,
        description="Outboxes that get their own `outbox` label in the API's metrics besides"
        " those in `METRICS_OUTBOXES`: the most active ones seen; the rest count as `other`.",
    )
    metrics_outboxes: str = Field(
        default="",
        description="Outboxes, comma-separated, that always get their own `outbox` label in"
        " the API's metrics.",
    )

    fake_provider_url: str = Field(
        default="http://127.0.0.1:8025",
        description="The fake provider (`make dev`), where the shipped destinations send.",
    )
    # How long a workflow task waits on the worker that ran the workflow last (its cached copy)
    # before any worker may take it, replaying the history. After that worker dies, its items
    # stall this long. Shorter than the SDK's default, at no cost to a healthy worker.
    # Why: docs/decisions/sticky-queue-timeout.md
    sticky_queue_timeout_s: float = Field(
        default=3.0,
        gt=0,
        description="How long a workflow task waits for the worker that ran the workflow last"
        " before any worker may take it, in seconds: how long a dead worker's items stall.",
    )
    # A deploy's SIGTERM: submits and polls in flight finish (or, past the grace, are cancelled and
    # retried by another worker) rather than being cut mid-request. Keep it under the
    # orchestrator's own kill timeout (docker compose's stop_grace_period, Kubernetes'
    # terminationGracePeriodSeconds).
    worker_shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a stopping worker lets its in-flight activities finish before it"
        " cancels them, in seconds.",
    )
    # Connections the worker keeps to providers (all destinations share them). httpx's pool looks
    # at every connection on each request, so a pool larger than the concurrency a provider
    # needs costs CPU. Size it to rate x provider latency, with room.
    # Why: docs/decisions/provider-connection-pool.md
    provider_max_connections: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Connections the worker keeps to providers, all destinations together;"
        " size it to rate x provider latency, with room.",
    )
    worker_metrics_address: str = Field(
        default="127.0.0.1:9464",
        description="Where the worker serves Temporal SDK metrics for Prometheus (`host:port`);"
        " empty: off.",
    )
    # How long the API's /metrics reuses one reading of the backlog from the read model, so
    # frequent scrapes (or several Prometheus servers) cost one set of queries per interval.
    backlog_metrics_cache_s: float = Field(
        default=5.0,
        ge=0,
        description="How long the API's `/metrics` reuses one reading of the backlog from the"
        " read model, in seconds.",
    )
    backlog_metrics_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long a scrape waits for that reading, in seconds; past it,"
        " `outbox_backlog_scrape_ok` is 0.",
    )

    @property
    def codec_cors_origins_list(self) -> list[str]:
        return [o.strip() for o in self.codec_cors_origins.split(",") if o.strip()]

    @property
    def api_tokens(self) -> list[str]:
        """`API_TOKEN`'s tokens; an empty entry (`a,,b`, a lone comma, blanks) is an error, not a
        token nobody meant, so a typo cannot pass for a configured token."""
        if not self.api_token.strip():
            return []
        tokens = [token.strip() for token in self.api_token.split(",")]
        if not all(tokens):
            raise ValueError("API_TOKEN holds an empty token (check its commas)")
        return tokens

    @property
    def allowed_hosts_list(self) -> list[str]:
        return [host.strip() for host in self.allowed_hosts.split(",") if host.strip()] or ["*"]

    @property
    def metrics_outboxes_list(self) -> list[str]:
        return [o.strip() for o in self.metrics_outboxes.split(",") if o.strip()]

    @property
    def websocket_origins_list(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.websocket_origins.split(",") if o.strip()]


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
