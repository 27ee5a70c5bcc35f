"""Retention's settings: defaults that outlive every delivery, and a retention shorter than a
destination's longest possible delivery (or an item retention shorter than the payload's)
refused at load, per destination and per outbox, naming why."""

from __future__ import annotations

from pathlib import Path

import pytest
from durable_outbox_temporal.destinations import (
    DEFAULT_ITEM_RETENTION_S,
    DEFAULT_PAYLOAD_RETENTION_S,
    Destination,
    DestinationConfigError,
    DestinationRegistry,
)
from pydantic import ValidationError

from configuration.destinations import load_destinations

HOOK = {"name": "hook", "provider": "webhook", "settings": {"url": "http://127.0.0.1:9/"}}
# A destination that takes delivery reports: it listens for them 72 h unless told otherwise.
REPORTING = {**HOOK, "events_secret": "a-secret-of-16-characters"}
DAY = 86400.0


def test_the_longest_delivery_counts_attempts_waits_retry_after_polls_and_reports() -> None:
    policy = Destination.model_validate(REPORTING).delivery
    waits = sum(policy.backoff_s(n) * 1.2 for n in range(1, 8))
    expected = 8 * 30 + waits + 3600 + 30 + 72 * 3600
    assert policy.longest_delivery_s() == pytest.approx(expected)
    # A provider allowed to ask for an hour's Retry-After may wait it before every retry.
    assert policy.longest_delivery_s(3600) == pytest.approx(expected - waits + 7 * 3600)


def test_defaults_keep_a_month_of_payloads_and_a_year_of_rows_or_longer() -> None:
    usual = Destination.model_validate(HOOK)
    assert (usual.payload_retention, usual.item_retention) == (
        DEFAULT_PAYLOAD_RETENTION_S,
        DEFAULT_ITEM_RETENTION_S,
    )
    # A report window of 200 days: the defaults grow to outlive it, rather than refuse.
    long_reports = Destination.model_validate({**HOOK, "report_window_s": 200 * DAY})
    assert long_reports.payload_retention == long_reports.longest_delivery_s > 200 * DAY
    assert long_reports.item_retention == DEFAULT_ITEM_RETENTION_S


def test_a_retention_shorter_than_the_longest_delivery_is_refused_naming_why() -> None:
    with pytest.raises(ValidationError, match="longest possible delivery") as short:
        Destination.model_validate({**REPORTING, "payload_retention_s": DAY})
    assert "report_window_s 259200" in str(short.value)
    with pytest.raises(ValidationError, match="max_retry_after_s"):
        Destination.model_validate(
            {
                **REPORTING,
                "payload_retention_s": 4 * DAY,
                "settings": {**HOOK["settings"], "max_retry_after_s": 30 * DAY},  # type: ignore[dict-item]
            }
        )
    with pytest.raises(ValidationError, match="item_retention_s .* shorter than payload"):
        Destination.model_validate(
            {**HOOK, "payload_retention_s": 9 * DAY, "item_retention_s": 8 * DAY}
        )


def test_an_outboxs_retention_is_checked_against_every_destination(tmp_path: Path) -> None:
    config = tmp_path / "destinations.toml"
    config.write_text(
        """
[destinations.hook]
provider = "webhook"
[destinations.hook.settings]
url = "http://127.0.0.1:9/"
secret = "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"

[destinations.reports]
provider = "webhook"
report_window_s = 864000
[destinations.reports.settings]
url = "http://127.0.0.1:9/"
secret = "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"

[outboxes.brief]
payload_retention_s = 432000
"""
    )
    with pytest.raises(DestinationConfigError) as refused:
        load_destinations(config)
    assert "outbox 'brief'" in str(refused.value) and "'reports'" in str(refused.value)

    config.write_text(config.read_text().replace("432000", "1209600"))
    registry: DestinationRegistry = load_destinations(config)
    hook = registry.get("hook")
    assert hook is not None
    assert registry.retention("brief", hook) == (14 * DAY, DEFAULT_ITEM_RETENTION_S)
    assert registry.retention(None, hook) == (DEFAULT_PAYLOAD_RETENTION_S, DEFAULT_ITEM_RETENTION_S)
    assert registry.overridden_outboxes() == ["brief"]
