"""A receiver for a `webhook` destination: it verifies every delivery with the Standard Webhooks
reference library and handles each `webhook-id` once, however often the outbox retries it.

The outbox sends a message until the receiver answers 2xx, so a message whose answer was lost
comes again under the same `webhook-id` (docs/explanation/provider-dedupe.md). The receiver
records the id in the same database transaction as what it does with the message: either both
are kept (and a repeat is answered 204 without being handled again), or neither (the receiver
answers 500 and the outbox's retry handles it afresh). Ids are kept for `keep_ids_s`, which must
outlast the destination's longest retry span. Run it with the destination's secret:

    WEBHOOK_SECRET=whsec_... WEBHOOK_DB=webhooks.sqlite3 \\
      .venv/bin/uvicorn --factory examples.webhook_receiver.receiver:from_environment --port 8200
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from standardwebhooks import Webhook, WebhookVerificationError

# Longer than any destination's retry span (`max_attempts` x `backoff_max_s`, plus pauses).
KEEP_IDS_S = 7 * 24 * 3600.0
# What the receiver does with a message, inside the transaction that records its id.
Handler = Callable[[sqlite3.Connection, str, Any], None]


def record_event(db: sqlite3.Connection, message_id: str, payload: Any) -> None:
    """The example's handling: keep the event (a real receiver acts on it here, in the same
    transaction)."""
    db.execute(
        "INSERT INTO events (webhook_id, payload) VALUES (?, ?)", (message_id, json.dumps(payload))
    )


class WebhookInbox:
    """The ids handled, in the receiver's database, beside what handling them wrote."""

    def __init__(self, path: str | Path, keep_ids_s: float = KEEP_IDS_S) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.keep_ids_s = keep_ids_s
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS seen_webhooks (id TEXT PRIMARY KEY, seen_at REAL NOT NULL)"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS events (webhook_id TEXT, payload TEXT)")

    def handle_once(self, message_id: str, payload: Any, handler: Handler) -> bool:
        """Run `handler` unless `message_id` was handled already; whether it ran. The id and the
        handler's writes commit together, or not at all if the handler raises."""
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("DELETE FROM seen_webhooks WHERE seen_at < ?", (now - self.keep_ids_s,))
            try:
                self.db.execute(
                    "INSERT INTO seen_webhooks (id, seen_at) VALUES (?, ?)", (message_id, now)
                )
            except sqlite3.IntegrityError:
                self.db.execute("ROLLBACK")
                return False
            handler(self.db, message_id, payload)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return True


def create_app(secret: str, inbox: WebhookInbox, handler: Handler = record_event) -> FastAPI:
    """The receiver: `POST /webhooks` verified with `secret` (the destination's), deduped by
    `inbox`."""
    verifier = Webhook(secret)
    app = FastAPI(title="Webhook receiver example")

    @app.post("/webhooks", status_code=204)
    async def receive(request: Request) -> Response:
        body = await request.body()
        try:
            # Checks the signature (any of the rotation's) and that the timestamp is recent.
            payload = verifier.verify(body, dict(request.headers))
        except (WebhookVerificationError, ValueError):
            return Response(status_code=401)
        inbox.handle_once(request.headers["webhook-id"], payload, handler)
        # A repeat is answered 2xx too: the outbox stops retrying what was handled.
        return Response(status_code=204)

    return app


def from_environment() -> FastAPI:
    """The receiver configured by `WEBHOOK_SECRET` and `WEBHOOK_DB` (for `uvicorn --factory`)."""
    inbox = WebhookInbox(os.environ.get("WEBHOOK_DB", "webhooks.sqlite3"))
    return create_app(os.environ["WEBHOOK_SECRET"], inbox)
