"""Process settings, read once from the environment (and `.env`), shared by worker, API and CLI."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.ids import OPERATIONS_TASK_QUEUE, WORKFLOW_TASK_QUEUE

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Configuration of every durable-outbox process. Each field is an env var of the same name.

    The Temporal connection is not here: it follows Temporal's own standard (`TEMPORAL_ADDRESS`,
    `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS_*`, profiles), read by
    `outbox_client.connect`.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    workflow_task_queue: str = WORKFLOW_TASK_QUEUE
    # Where the worker runs the operations activities (scheduled fan-out, redrive batches).
    operations_task_queue: str = OPERATIONS_TASK_QUEUE
    outbox_config: Path = Field(default=PROJECT_ROOT / "config" / "destinations.toml")
    database_url: str = f"sqlite:///{PROJECT_ROOT / '.data' / 'readmodel.db'}"

    # Bearer tokens the API accepts (comma-separated); empty means the API runs open.
    api_token: str = ""
    # A TOML file of scoped tokens (their SHA-256, scopes and outboxes; see api/auth.py and the
    # README); empty: none.
    api_tokens_file: str = ""
    # The transactional outbox's relay (`service.relay`): run inside each worker process that
    # runs workflows; how often it polls (PostgreSQL also wakes it on commit); how long relayed
    # rows are kept.
    relay_enabled: bool = True
    relay_poll_interval_s: float = Field(default=0.25, gt=0)
    relay_retention_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    # Claim checks: a payload above this many bytes (after encryption) is stored once in the
    # database (`payload_blobs`) and the workflow history carries a reference; 0 turns it off
    # (payloads then stay under Temporal's own payload size limit, about 2 MB).
    claim_check_bytes: int = Field(default=64 * 1024, ge=0)
    # Payload encryption keys, `key-id:base64,...`, the first one current (see common/codec.py,
    # which every Temporal client reads them with, `outbox_client.connect` included); empty:
    # payloads in plain text.
    payload_keys: str = ""
    # Browser origins allowed to call the API (the Web UI calling the codec server), comma-
    # separated; the dev Web UI's by default.
    codec_cors_origins: str = "http://127.0.0.1:8233,http://localhost:8233"
    # How long a cancel waits for a worker before it is recorded as a signal (202) instead.
    cancel_wait_s: float = 5.0
    # Largest accepted request body, in bytes (413 above it).
    max_request_bytes: int = 10 * 1024 * 1024

    fake_provider_url: str = "http://127.0.0.1:8025"
    # How long a workflow task waits on the worker that ran the workflow last (its cached copy)
    # before any worker may take it, replaying the history. After that worker dies, its items
    # stall this long. 3 s, not the SDK's 10 s: measured, a healthy worker lost nothing by it.
    sticky_queue_timeout_s: float = Field(default=3.0, gt=0)
    # Connections the worker keeps to providers (all destinations share them). httpx's pool looks
    # at every connection on each request, so a pool larger than the concurrency a provider
    # needs costs CPU: measured against the bench's sub-millisecond fake, 10 instead of 100 gave
    # 7.4-8.6 ms of worker CPU per bulk item against 10.3-11.2. Size it to rate x provider
    # latency, with room.
    provider_max_connections: int = Field(default=100, ge=1, le=10_000)
    # Where the worker serves Temporal SDK metrics for Prometheus (host:port); empty disables.
    worker_metrics_address: str = "127.0.0.1:9464"
    # How long the API's /metrics reuses one reading of the backlog from the read model, so
    # frequent scrapes (or several Prometheus servers) cost one set of queries per interval.
    backlog_metrics_cache_s: float = Field(default=5.0, ge=0)
    # How long a scrape waits for that reading; past it, `outbox_backlog_scrape_ok` is 0.
    backlog_metrics_timeout_s: float = Field(default=5.0, gt=0)

    @property
    def codec_cors_origins_list(self) -> list[str]:
        return [o.strip() for o in self.codec_cors_origins.split(",") if o.strip()]

    @property
    def api_tokens(self) -> list[str]:
        return [token.strip() for token in self.api_token.split(",") if token.strip()]


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
