"""Destinations: the policy's defaults and bounds come from DeliveryPolicy, the file stays flat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.contract.item import POLICY_SETTINGS, DeliveryPolicy
from durable_outbox_temporal.destinations import (
    BULK_REPORT_WINDOW_S,
    MIN_RATE,
    Destination,
    DestinationConfigError,
    DestinationRegistry,
)
from pydantic import ValidationError

from configuration.providers import WebhookSettings

# Outside DeliveryPolicy's bounds (Ge/Gt/Le), one per policy setting.
OUT_OF_BOUNDS: dict[str, Any] = {
    "max_attempts": 1001,
    "backoff_initial_s": 0,
    "backoff_multiplier": 0.5,
    "backoff_max_s": -1,
    "backoff_jitter": 1.5,
    "poll_interval_s": 0,
    "poll_backoff_multiplier": 0.9,
    "poll_interval_max_s": 0,
    "poll_deadline_s": -5,
    "submit_timeout_s": 0,
    "poll_timeout_s": 0,
    "report_window_s": 366 * 24 * 3600,
    "poll_in_submit": "sometimes",
    "order": "whenever",
}


def load(raw: dict[str, Any], environ: dict[str, str] | None = None) -> DestinationRegistry:
    return DestinationRegistry.from_mapping(raw, environ or {}, provider_settings=None)


def test_out_of_bounds_table_covers_every_policy_setting() -> None:
    assert set(OUT_OF_BOUNDS) == set(POLICY_SETTINGS)


def test_defaults_are_delivery_policys_own() -> None:
    secret = "a-secret-of-16-characters"
    policy = Destination(name="mail", provider="webhook", events_secret=secret).policy()

    assert policy == DeliveryPolicy(
        destination="mail",
        submit_task_queue="outbox-submit-mail",
        poll_task_queue="outbox-poll-mail",
    )


def test_a_destination_that_takes_no_reports_does_not_listen_for_them_unless_told() -> None:
    # No `events_secret`: no report reaches it through the API, so its sent items end at once
    # rather than wait out the 72 h default (held by a shard, in bulk mode).
    assert Destination(name="mail", provider="acs-email").delivery.report_window_s == 0
    assert load({"mail": {"provider": "acs-email"}}).get("mail").delivery.report_window_s == 0  # type: ignore[union-attr]
    # Told, it listens (reports may come through `OutboxClient.report_delivery`).
    told = Destination(name="mail", provider="acs-email", report_window_s=3600)
    assert told.delivery.report_window_s == 3600
    secret = "a-secret-of-16-characters"
    taking = Destination(name="mail", provider="acs-email", events_secret=secret)
    assert taking.delivery.report_window_s == 72 * 3600
    # In bulk mode a shard holds each sent item for the window: a minute, unless set (a later
    # report goes to the item's read-model row).
    bulk = Destination(name="mail", provider="acs-email", events_secret=secret, mode="bulk")
    assert bulk.delivery.report_window_s == BULK_REPORT_WINDOW_S == 60
    told_bulk = Destination(
        name="mail", provider="acs-email", events_secret=secret, mode="bulk", report_window_s=7200
    )
    assert told_bulk.delivery.report_window_s == 7200


def test_every_flat_file_field_reaches_the_policy() -> None:
    defaults = DeliveryPolicy(destination="d", submit_task_queue="s", poll_task_queue="p")
    # A valid value different from each default: one more than it, within every upper bound.
    configured: dict[str, Any] = {
        name: getattr(defaults, name) + (1 if name == "max_attempts" else 0.125)
        for name in POLICY_SETTINGS
        # Switches: `poll_in_submit` has rules of its own (tested below), `order` two values.
        if name not in ("poll_in_submit", "order")
    }

    configured["order"] = "submit"
    registry = load({"mail": {"provider": "webhook", **configured}})
    policy = registry.get("mail").policy()  # type: ignore[union-attr]

    assert {name: getattr(policy, name) for name in configured} == configured


def test_poll_in_submit_reaches_the_policy_and_takes_the_first_polls_out_of_the_poll_queue() -> (
    None
):
    registry = load(
        {
            "mail": {
                "provider": "acs-email",
                "poll_in_submit": True,
                "submit_rate": 2,
                "poll_rate": 5,
                "poll_interval_s": 0.5,
            }
        }
    )
    mail = registry.get("mail")

    assert mail is not None and mail.poll_in_submit and mail.policy().poll_in_submit
    # Each submit may make a poll: the poll queue runs what that leaves of the poll rate.
    assert mail.poll_queue_rate == 3 and mail.submit_queue_rate == 2


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"poll_rate": 2}, r"poll_in_submit needs poll_rate above submit_rate \(2 <= 2\)"),
        ({"poll_interval_s": 2}, r"poll_in_submit needs poll_interval_s of at most 1 \(it is 2\)"),
        ({"mode": "bulk"}, r"poll_in_submit: only a destination in item mode"),
    ],
)
def test_poll_in_submit_is_refused_where_it_cannot_keep_the_rates(
    settings: dict[str, Any], why: str
) -> None:
    mail = {
        "provider": "acs-email",
        "poll_in_submit": True,
        "submit_rate": 2,
        "poll_rate": 5,
        "poll_interval_s": 0.5,
    }
    with pytest.raises(DestinationConfigError, match=rf"destination 'mail': .*{why}"):
        load({"mail": {**mail, **settings}})


def test_file_fields_and_overrides_reach_the_policy(tmp_path: Path) -> None:
    config = tmp_path / "destinations.toml"
    config.write_text(
        """
[destinations.fake-email]
provider = "acs-email"
submit_rate = 3
max_attempts = 5
poll_interval_s = 7.5
[destinations.fake-email.settings]
endpoint = "${FAKE_URL}/acs"
"""
    )
    environ = {
        "FAKE_URL": "http://fake.test",
        "DEST_FAKE_EMAIL_MAX_ATTEMPTS": "4",
        "DEST_FAKE_EMAIL_BACKOFF_JITTER": "0.5",
        "DEST_FAKE_EMAIL_SETTINGS_ACCESS_KEY": "a2V5",
    }

    registry = DestinationRegistry.from_file(config, environ, provider_settings=None)
    destination = registry.get("fake-email")

    assert destination is not None
    policy = destination.policy()
    assert (policy.max_attempts, policy.poll_interval_s, policy.backoff_jitter) == (4, 7.5, 0.5)
    assert policy.backoff_initial_s == DeliveryPolicy.backoff_initial_s
    assert (destination.submit_rate, destination.max_attempts) == (3.0, 4)
    assert destination.settings == {"endpoint": "http://fake.test/acs", "access_key": "a2V5"}
    assert (policy.destination, policy.submit_task_queue, policy.poll_task_queue) == (
        "fake-email",
        destination.submit_task_queue,
        destination.poll_task_queue,
    )
    assert destination.submit_task_queue == "outbox-submit-fake-email"


@pytest.mark.parametrize(("field", "value"), sorted(OUT_OF_BOUNDS.items()))
def test_out_of_bounds_policy_value_is_refused_naming_destination_and_field(
    field: str, value: Any
) -> None:
    with pytest.raises(DestinationConfigError, match=rf"destination 'mail': {field}: ") as error:
        load({"mail": {"provider": "webhook", field: value}})

    assert "delivery" not in str(error.value)


def test_out_of_bounds_override_is_refused_naming_destination_and_field() -> None:
    with pytest.raises(
        DestinationConfigError, match=r"^<config>: destination 'mail': max_attempts: .*integer"
    ):
        load({"mail": {"provider": "webhook"}}, {"DEST_MAIL_MAX_ATTEMPTS": "many"})


@pytest.mark.parametrize("field", ["submit_rate", "poll_rate"])
@pytest.mark.parametrize("rate", [0, 9.7e-39, MIN_RATE / 2])
def test_rates_are_at_least_the_minimum(field: str, rate: float) -> None:
    with pytest.raises(
        DestinationConfigError, match=rf"'mail': {field}: .*greater than or equal to 0.001"
    ):
        load({"mail": {"provider": "webhook", field: rate}})


def test_the_minimum_rate_is_accepted_from_the_file_and_the_environment() -> None:
    registry = load(
        {"mail": {"provider": "webhook", "submit_rate": MIN_RATE}},
        {"DEST_MAIL_POLL_RATE": "0.001"},
    )

    mail = registry.get("mail")
    assert mail is not None and (mail.submit_rate, mail.poll_rate) == (MIN_RATE, MIN_RATE)
    with pytest.raises(DestinationConfigError, match=r"'mail': poll_rate: .*0.001"):
        load({"mail": {"provider": "webhook"}}, {"DEST_MAIL_POLL_RATE": "9.7e-39"})


def test_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(DestinationConfigError, match=r"'mail': max_attemps: unknown field"):
        load({"mail": {"provider": "webhook", "max_attemps": 3}})


def test_delivery_is_not_an_input() -> None:
    with pytest.raises(DestinationConfigError, match=r"'mail': delivery: unknown field"):
        load({"mail": {"provider": "webhook", "delivery": {"max_attempts": 3}}})


@pytest.mark.parametrize("requested", [1, 3, 5])
def test_requested_max_attempts_only_lowers_the_limit(requested: int) -> None:
    destination = Destination(name="mail", provider="webhook", max_attempts=5)

    assert destination.policy(max_attempts=requested).max_attempts == requested
    assert destination.policy(max_attempts=50).max_attempts == 5
    assert destination.policy().max_attempts == 5


def test_policy_is_a_copy_the_destination_does_not_share() -> None:
    destination = Destination(name="mail", provider="webhook")

    policy = destination.policy()
    policy.max_attempts = 1

    assert destination.policy().max_attempts == DeliveryPolicy.max_attempts


@pytest.mark.parametrize("name", ["Mail", "-mail", "mail_box", "m" * 64, ""])
def test_bad_names_are_refused_by_the_contracts_rule(name: str) -> None:
    with pytest.raises(DestinationConfigError, match=rf"destination '{name}': name: destination"):
        load({name: {"provider": "webhook"}})


def test_longest_allowed_name_loads() -> None:
    assert "m" * 63 in load({"m" * 63: {"provider": "webhook"}})


def test_unset_environment_variable_names_the_destination() -> None:
    with pytest.raises(DestinationConfigError, match=r"'mail': environment variable NOPE"):
        load({"mail": {"provider": "webhook", "settings": {"url": "${NOPE}"}}})


def test_default_of_an_unset_variable_is_used() -> None:
    registry = load({"mail": {"provider": "webhook", "settings": {"url": "${NOPE:-http://x}"}}})

    assert registry.get("mail").settings == {"url": "http://x"}  # type: ignore[union-attr]


def test_default_of_an_empty_variable_is_used_as_the_shell_does() -> None:
    raw = {"mail": {"provider": "webhook", "settings": {"url": "${EMPTY:-http://x}"}}}
    registry = load(raw, {"EMPTY": ""})

    assert registry.get("mail").settings == {"url": "http://x"}  # type: ignore[union-attr]
    # Without a default, an empty variable is its value.
    plain = load({"mail": {"provider": "webhook", "settings": {"url": "${EMPTY}"}}}, {"EMPTY": ""})
    assert plain.get("mail").settings == {"url": ""}  # type: ignore[union-attr]


def test_missing_file_and_bad_toml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(DestinationConfigError, match="not found"):
        DestinationRegistry.from_file(tmp_path / "none.toml", {}, provider_settings=None)
    broken = tmp_path / "broken.toml"
    broken.write_text("[destinations.x\n")
    with pytest.raises(DestinationConfigError, match="invalid TOML"):
        DestinationRegistry.from_file(broken, {}, provider_settings=None)


def test_events_secret_is_kept_secret_and_long_enough() -> None:
    registry = load({"mail": {"provider": "acs-email", "events_secret": "s" * 16}})
    mail = registry.get("mail")

    assert mail is not None and mail.events_secret is not None
    assert mail.events_secret.get_secret_value() == "s" * 16
    assert "ssss" not in repr(mail)
    with pytest.raises(DestinationConfigError, match="events_secret"):
        load({"mail": {"provider": "acs-email", "events_secret": "short"}})


def test_the_flow_table_and_its_overrides_reach_the_destination() -> None:
    registry = load(
        {"mail": {"provider": "webhook", "flow": {"throttle_max_pause_s": 60}}},
        {"DEST_MAIL_FLOW_THROTTLE_PAUSE": "false", "DEST_MAIL_FLOW_THROTTLE_RAMP_STEP_S": "5"},
    )
    destination = registry.get("mail")
    assert destination is not None
    flow = destination.flow
    assert (flow.throttle_pause, flow.throttle_max_pause_s, flow.throttle_ramp_step_s) == (
        False,
        60.0,
        5.0,
    )
    default = load({"mail": {"provider": "webhook"}}).get("mail")
    assert default is not None and default.flow.throttle_pause  # on unless turned off


def test_a_bad_flow_field_is_refused_by_name() -> None:
    with pytest.raises(DestinationConfigError, match=r"'mail': flow.throttle_paws: unknown"):
        load({"mail": {"provider": "webhook", "flow": {"throttle_paws": True}}})
    with pytest.raises(DestinationConfigError, match=r"'mail': flow.throttle_max_pause_s: "):
        load({"mail": {"provider": "webhook"}}, {"DEST_MAIL_FLOW_THROTTLE_MAX_PAUSE_S": "-1"})


def test_lane_run_loads_from_the_file_and_the_environment_with_a_quota_that_holds_the_rate() -> (
    None
):
    quota = {"quotas": [{"per": "100ms", "max": 20}]}
    registry = load(
        {"mail": {"provider": "webhook", "submit_rate": 200, "flow": quota}},
        {"DEST_MAIL_LANE_RUN": "25"},
    )
    mail = registry.get("mail")
    assert mail is not None and mail.lane_run == 25
    default = load({"mail": {"provider": "webhook"}}).get("mail")
    assert default is not None and default.lane_run == 1


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({}, r"lane_run 5 needs a quota .* quotas = \[\{ per = \"1s\", max = 10 \}\]"),
        # A quota looser than the rate, or one over a longer window, does not hold it.
        ({"flow": {"quotas": [{"per": "1s", "max": 11}]}}, "lane_run 5 needs a quota"),
        ({"flow": {"quotas": [{"per": "1m", "max": 60}]}}, "lane_run 5 needs a quota"),
        (
            {"mode": "bulk", "flow": {"quotas": [{"per": "1s", "max": 10}]}},
            "lane_run: a bulk destination's lanes .* set submit_batch instead",
        ),
    ],
)
def test_lane_run_is_refused_where_nothing_would_hold_its_requests_to_the_rate(
    settings: dict[str, Any], why: str
) -> None:
    hook = {"provider": "webhook", "submit_rate": 10, "lane_run": 5}
    with pytest.raises(DestinationConfigError, match=rf"destination 'mail': .*{why}"):
        load({"mail": {**hook, **settings}})
    held = {"flow": {"quotas": [{"per": "1s", "max": 10}]}}
    assert load({"mail": {**hook, **held}}).get("mail") is not None


def test_the_registry_says_which_destinations_shards_hold() -> None:
    registry = load(
        {
            "zeta": {"provider": "webhook", "mode": "bulk"},
            "mail": {"provider": "webhook"},
            "alpha": {"provider": "webhook", "mode": "bulk", "shards": 2},
        }
    )

    assert registry.bulk("zeta") is registry.get("zeta")
    assert registry.bulk("mail") is None  # item mode
    assert registry.bulk("gone") is None and registry.bulk(None) is None
    # In the order the file lists them (a purge sweeps them in that order).
    assert [d.name for d in registry.bulk_destinations()] == ["zeta", "alpha"]


def test_a_replaced_events_secret_is_taken_only_within_its_grace_window() -> None:
    secret, previous = "the-new-events-secret", "the-old-events-secret"
    until = datetime(2026, 12, 1, tzinfo=UTC)
    rotating = Destination(
        name="mail",
        provider="acs-email",
        events_secret=secret,
        previous_events_secret=previous,
        previous_events_secret_until=until,
    )

    assert rotating.events_secrets(until - timedelta(seconds=1)) == [secret, previous]
    assert rotating.events_secrets(until) == [secret]
    assert Destination(name="mail", provider="acs-email").events_secrets(until) == []
    refused = {
        "previous_events_secret and previous_events_secret_until go together": {
            "events_secret": secret,
            "previous_events_secret": previous,
        },
        "needs the events_secret": {
            "previous_events_secret": previous,
            "previous_events_secret_until": until,
        },
        "the same as events_secret": {
            "events_secret": secret,
            "previous_events_secret": secret,
            "previous_events_secret_until": until,
        },
    }
    for message, fields in refused.items():
        with pytest.raises(ValidationError, match=message):
            Destination(name="mail", provider="acs-email", **fields)


def test_an_infinite_or_nan_number_is_refused_naming_its_field() -> None:
    # TOML writes `inf` and `nan`, an environment override "inf": a timeout of inf would fail
    # every workflow task that schedules the activity (timedelta overflows), for good.
    hook = {"url": "http://127.0.0.1:9/", "secret": "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"}
    cases = {
        "submit_timeout_s": {"submit_timeout_s": float("inf")},
        "poll_interval_s": {"poll_interval_s": "nan"},
        "settings.timeout_s": {"settings": {**hook, "timeout_s": "inf"}},
        "flow.quotas": {"flow": {"quotas": [{"per": float("inf"), "max": 5}]}},
    }
    for field, fields in cases.items():
        with pytest.raises((ValidationError, DestinationConfigError)) as refused:
            destination = Destination(
                name="hook", provider="webhook", **{"settings": hook, **fields}
            )
            destination.settings_as(WebhookSettings)
        text = str(refused.value)
        assert field.split(".")[-1] in text, (field, text)
        assert "finite" in text or "nan" in text.lower() or "inf" in text.lower(), text
