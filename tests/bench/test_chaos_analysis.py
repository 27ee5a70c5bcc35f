"""The judge of `make chaos`: each check passes a clean run and fails exactly its own defect."""

from __future__ import annotations

import time
from dataclasses import replace
from email.utils import formatdate

import pytest

from bench.chaos_analysis import (
    ChaosRun,
    ItemEvidence,
    QueueTraffic,
    SubmitAnswer,
    Verdict,
    busiest_window,
    judge,
    retry_not_before,
)

T0 = 1_800_000_000.0  # a whole second, so HTTP-dates name it exactly
LIMIT_PER_S = 5.0  # allowed: 10 requests in 1 s, 55 in 10 s (limit x (window + 1 s burst))


def accepted(at: float) -> SubmitAnswer:
    return SubmitAnswer(arrived_at=at, answered_at=at + 0.01, status=202)


def throttled(at: float, retry_after: str) -> SubmitAnswer:
    return SubmitAnswer(arrived_at=at, answered_at=at, status=429, retry_after=retry_after)


def sent(n: int, *answers: SubmitAnswer) -> ItemEvidence:
    """A cleanly sent item: delivered once, the read model agrees."""
    return ItemEvidence(
        item_id=f"item-{n}",
        outcome="sent",
        deliveries=1,
        read_model_status="sent",
        answers=answers or (accepted(T0 + n),),
    )


def clean_run(*extra: ItemEvidence, **changes: object) -> ChaosRun:
    run = ChaosRun(
        items=(sent(1), sent(2), *extra),
        queues=(QueueTraffic("chaos-email submit", LIMIT_PER_S, (T0, T0 + 0.5, T0 + 2)),),
        kill_times=(T0 + 100, T0 + 200, T0 + 300),
        kills_planned=3,
    )
    return replace(run, **changes)  # type: ignore[arg-type]


def failing(verdict: Verdict) -> dict[str, int]:
    return {check.name: check.count for check in verdict.checks if not check.passed}


def test_clean_run_passes_every_check() -> None:
    failed_as_expected = ItemEvidence(
        "item-3", "failed", deliveries=1, provider_failed=True, read_model_status="failed"
    )
    verdict = judge(clean_run(failed_as_expected))
    assert verdict.passed
    assert failing(verdict) == {}
    assert verdict.problems == []
    assert verdict.outcomes == {"sent": 2, "failed": 1}
    assert verdict.failed_expected == 1
    assert verdict.operations_failed_by_provider == 1


def test_an_unfinished_item_is_lost() -> None:
    verdict = judge(clean_run(ItemEvidence("item-3", "unfinished")))
    assert not verdict.passed
    assert failing(verdict) == {"lost": 1}
    assert verdict.problems == ["item-3: lost, not final (unfinished)"]


def test_an_item_sent_but_never_accepted_by_the_provider_is_lost() -> None:
    verdict = judge(clean_run(replace(sent(3), deliveries=0, answers=())))
    assert failing(verdict) == {"lost": 1}


def test_a_failure_the_provider_did_not_cause_is_unexpected() -> None:
    item = ItemEvidence("item-3", "failed", 1, read_model_status="failed", last_error="boom")
    verdict = judge(clean_run(item))
    assert failing(verdict) == {"failed_unexpected": 1}
    assert verdict.problems == ["item-3: failed unexpectedly: boom"]


def test_sent_though_the_provider_failed_the_operation() -> None:
    verdict = judge(clean_run(replace(sent(3), provider_failed=True)))
    assert failing(verdict) == {"sent_but_provider_failed": 1}


def test_a_key_delivered_twice_is_a_duplicate() -> None:
    verdict = judge(clean_run(replace(sent(3), deliveries=2)))
    assert failing(verdict) == {"duplicates": 1}


def test_a_key_accepted_twice_without_a_kill_between_is_a_duplicate() -> None:
    # The provider dedupes (one delivery) but a second accepted submit still means a bug.
    verdict = judge(clean_run(sent(3, accepted(T0 + 10), accepted(T0 + 20))))
    assert failing(verdict) == {"duplicates": 1}
    assert verdict.resubmitted_after_kill == ()


@pytest.mark.parametrize("killed_at", [T0 + 10, T0 + 15, T0 + 20])
def test_a_resubmit_after_a_kill_is_harmless(killed_at: float) -> None:
    # A kill exactly on either acceptance still falls "in between".
    run = clean_run(sent(3, accepted(T0 + 10), accepted(T0 + 20)), kill_times=(killed_at,) * 3)
    verdict = judge(run)
    assert verdict.passed
    assert len(verdict.resubmitted_after_kill) == 1
    assert verdict.resubmitted_after_kill[0].startswith("item-3: answers: +0.00s 202, +10.00s 202")


def test_a_kill_before_the_first_acceptance_does_not_excuse_a_second() -> None:
    run = clean_run(sent(3, accepted(T0 + 10), accepted(T0 + 20)), kill_times=(T0 + 9.99,) * 3)
    assert failing(judge(run)) == {"duplicates": 1}


def test_a_retry_half_a_second_before_retry_after_seconds_is_early() -> None:
    item = sent(3, throttled(T0, "2"), accepted(T0 + 1.5))
    verdict = judge(clean_run(item))
    assert failing(verdict) == {"early_requests": 1}
    assert verdict.problems[0].startswith("item-3: 1 request(s) before a Retry-After; answers: ")


def test_a_retry_exactly_at_retry_after_seconds_is_on_time() -> None:
    assert judge(clean_run(sent(3, throttled(T0, "2"), accepted(T0 + 2)))).passed


def test_retry_after_seconds_count_from_the_answer_not_the_arrival() -> None:
    slow_answer = SubmitAnswer(T0, T0 + 1, 429, "2")
    verdict = judge(clean_run(sent(3, slow_answer, accepted(T0 + 2.5))))
    assert failing(verdict) == {"early_requests": 1}


@pytest.mark.parametrize(("retry_at", "early"), [(T0 + 1.5, 1), (T0 + 2, 0)])
def test_retry_after_http_date(retry_at: float, early: int) -> None:
    item = sent(3, throttled(T0, formatdate(T0 + 2, usegmt=True)), accepted(retry_at))
    assert judge(clean_run(item)).check("early_requests").count == early


def test_every_request_before_the_retry_after_counts() -> None:
    # The 503 in between does not lift the 429's Retry-After.
    answers = (
        throttled(T0, "2"),
        SubmitAnswer(T0 + 0.5, T0 + 0.5, 503),
        accepted(T0 + 1),
    )
    assert failing(judge(clean_run(sent(3, *answers)))) == {"early_requests": 2}


def test_a_request_already_in_flight_is_not_bound_by_a_later_answer() -> None:
    # Sent before the 429 was answered: the client could not have known.
    answers = (SubmitAnswer(T0, T0 + 1, 429, "2"), accepted(T0 + 0.5))
    assert judge(clean_run(sent(3, *answers))).passed


def test_retry_not_before() -> None:
    assert retry_not_before(T0, "2") == T0 + 2
    assert retry_not_before(T0, formatdate(T0 + 3, usegmt=True)) == T0 + 3
    assert retry_not_before(T0, "soon") is None


def test_a_retry_after_date_without_a_zone_is_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    # Never the machine's local time: the delivery client reads it as UTC too.
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        naive = formatdate(T0 + 3, usegmt=True).replace("GMT", "-0000")
        assert retry_not_before(0, naive) == T0 + 3
    finally:
        monkeypatch.undo()
        time.tzset()


def queue_run(*times: float) -> ChaosRun:
    return clean_run(queues=(QueueTraffic("chaos-email submit", LIMIT_PER_S, times),))


def test_one_request_over_the_limit_and_burst_in_a_second_is_a_violation() -> None:
    verdict = judge(queue_run(*(T0 + i * 0.05 for i in range(11))))
    assert failing(verdict) == {"rate_violations": 1}
    (window_1s, _) = verdict.rates[0].windows
    assert (window_1s.busiest, window_1s.allowed) == (11, 10)
    assert verdict.problems == [
        "chaos-email submit: 11 requests in 1 s / 11 in 10 s, above 10 / 55"
    ]


def test_exactly_the_limit_and_burst_in_a_second_passes() -> None:
    verdict = judge(queue_run(*(T0 + i * 0.05 for i in range(10))))
    assert verdict.passed
    assert verdict.rates[0].windows[0].busiest == 10


def test_a_window_is_half_open() -> None:
    # Ten in [0, 0.9] and one exactly a second after the first: no 1 s window holds eleven.
    times = [T0 + i * 0.1 for i in range(10)] + [T0 + 1.0]
    assert busiest_window(times, 1.0) == 10
    assert judge(queue_run(*times)).passed


@pytest.mark.parametrize(("requests", "violations"), [(55, 0), (56, 1)])
def test_the_ten_second_window(requests: int, violations: int) -> None:
    # Spread over 10 s, so no 1 s window is above its allowance of 10.
    verdict = judge(queue_run(*(T0 + i * 10 / requests for i in range(requests))))
    assert verdict.check("rate_violations").count == violations
    assert verdict.rates[0].windows[1].busiest == requests


def test_an_item_the_read_model_disagrees_with() -> None:
    verdict = judge(clean_run(replace(sent(3), read_model_status="queued")))
    assert failing(verdict) == {"readmodel_mismatches": 1}
    assert verdict.problems == ["item-3: sent, but the read model says queued"]


def test_an_item_missing_from_the_read_model_disagrees() -> None:
    verdict = judge(clean_run(replace(sent(3), read_model_status=None)))
    assert failing(verdict) == {"readmodel_mismatches": 1}


def test_too_few_worker_kills_fail_the_run() -> None:
    verdict = judge(clean_run(kill_times=(T0 + 100, T0 + 200)))
    assert failing(verdict) == {"worker_kills": 1}


def test_an_enqueue_refusal_fails_the_run() -> None:
    verdict = judge(clean_run(enqueue_refusals=("enqueue refused item-00007: HTTP 503",)))
    assert failing(verdict) == {"enqueue_refused": 1}
