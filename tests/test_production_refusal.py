"""A production worker and API, as deployed, refuse to start open: one message naming each open
field (the fake provider's published credentials, plain payloads), a non-zero exit, no
traceback; `ALLOW_INSECURE` aside."""

from __future__ import annotations

import os
import subprocess

import pytest

from configuration.settings import PROJECT_ROOT
from tests.faults.test_faults import free_port
from tests.test_schema_refusal import COMMANDS

# How each process calls itself in its refusal.
CALLED = {"worker": "worker", "api": "API"}
# Nothing of the caller's environment that could make the configuration private.
_CLEARED = {
    "API_TOKEN",
    "API_TOKENS_FILE",
    "PAYLOAD_KEYS",
    "PAYLOAD_KEYS_FILE",
    "FAKE_EMAIL_EVENTS_SECRET",
    "FAKE_ACS_ACCESS_KEY",
    "FAKE_WEBHOOK_SECRET",
    "FAKE_PAYMENT_TOKEN",
    "ALLOW_INSECURE",
}


@pytest.mark.parametrize("process", COMMANDS)
def test_a_production_process_refuses_the_fakes_public_credentials(process: str, tmp_path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in _CLEARED}
    env.update(
        OUTBOX_ENV="production",
        DATABASE_URL=f"sqlite:///{tmp_path / 'readmodel.db'}",
        # Unreachable: the refusal comes before any connection.
        TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        WORKER_METRICS_ADDRESS="",
    )
    done = subprocess.run(
        COMMANDS[process], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output
    assert f"refusing to start a production {CALLED[process]} (OUTBOX_ENV=production)" in output
    for named in (
        "PAYLOAD_KEYS",
        "'fake-email' signs with the fake provider's public settings.access_key",
        "'fake-webhook' signs with the fake provider's public settings.secret",
        "'fake-sms' takes delivery reports with the public development events_secret",
        "'fake-payments' signs with the fake provider's public settings.token",
    ):
        assert named in output, output


BULK_DESTINATIONS = """
[destinations.hooks-in-bulk]
provider = "webhook"
mode = "bulk"
[destinations.hooks-in-bulk.settings]
url = "http://127.0.0.1:9/hooks"
secret = "whsec_dGVzdC1zZWNyZXQtZm9yLWJ1bGstbW9kZQ=="
"""


@pytest.mark.parametrize("claim_check_bytes", ["0", "65536"])
def test_a_worker_refuses_bulk_shards_without_claim_checks(
    claim_check_bytes: str, tmp_path
) -> None:
    """A bulk shard carries its held items across continue-as-new in one payload, over 2 MB for a
    few thousand of them: without claim checks its workflow tasks fail from then on."""
    config = tmp_path / "destinations.toml"
    config.write_text(BULK_DESTINATIONS)
    env = {key: value for key, value in os.environ.items() if key not in _CLEARED}
    env.update(
        OUTBOX_CONFIG=str(config),
        CLAIM_CHECK_BYTES=claim_check_bytes,
        DATABASE_URL=f"sqlite:///{tmp_path / 'readmodel.db'}",
        # Unreachable: the refusal comes before any connection (a worker that passes it stops
        # there instead).
        TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        WORKER_METRICS_ADDRESS="",
    )
    done = subprocess.run(
        COMMANDS["worker"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    output = done.stdout + done.stderr
    assert done.returncode != 0, output  # refused, or no Temporal to reach
    refused = "CLAIM_CHECK_BYTES=0 refused: the bulk shards of hooks-in-bulk" in output
    assert refused == (claim_check_bytes == "0"), output
    if refused:
        assert "Traceback" not in output
