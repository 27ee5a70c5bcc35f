"""The judge of `make chaos`: pure checks over what a run gathered, with no I/O and no clock.

`bench.chaos` collects a `ChaosRun` (the fake provider's counters and answers, the workflows'
outcomes, the read model, the worker kills) and `judge` turns it into a `Verdict`: one `Check` per
property the run must hold, each with its count and the offending items, and overall pass/fail.
All times are seconds on one clock, chosen by the caller; only differences between them matter.
"""

from __future__ import annotations

import bisect
import email.utils
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC

# Statuses an item's workflow ends with; anything else at the deadline is a loss.
FINAL_STATUSES = ("sent", "failed")
# The server's token bucket may burst about one second's worth above the steady rate
# (docs/explanation/rate-limits.md): in a window of W seconds, up to rate * (W + BURST_S)
# requests are in the limit.
BURST_S = 1.0
RATE_WINDOWS_S = (1.0, 10.0)


@dataclass(frozen=True)
class SubmitAnswer:
    """One answer of the provider to a submit: arrival, answer, status and Retry-After header."""

    arrived_at: float
    answered_at: float
    status: int
    retry_after: str | None = None

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class ItemEvidence:
    """Everything seen of one item: its workflow's end, the provider's view, the read model's."""

    item_id: str
    outcome: str
    deliveries: int = 0
    provider_failed: bool = False
    read_model_status: str | None = None
    last_error: str | None = None
    answers: tuple[SubmitAnswer, ...] = ()


@dataclass(frozen=True)
class QueueTraffic:
    """The arrival time of every request one destination queue sent, and its configured rate."""

    name: str
    limit_per_s: float
    request_times: tuple[float, ...]


@dataclass(frozen=True)
class ChaosRun:
    """What one chaos run gathered, ready to judge."""

    items: tuple[ItemEvidence, ...]
    queues: tuple[QueueTraffic, ...] = ()
    kill_times: tuple[float, ...] = ()
    kills_planned: int = 0
    enqueue_refusals: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """One property of the run: how often it was broken and by what (empty when it held)."""

    name: str
    count: int
    examples: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.count == 0


@dataclass(frozen=True)
class WindowCount:
    """The busiest `window_s`-second window of a queue against what its rate allows."""

    window_s: float
    busiest: int
    allowed: int

    @property
    def exceeded(self) -> bool:
        return self.busiest > self.allowed


@dataclass(frozen=True)
class QueueRate:
    """A queue's busiest windows; a violation when any is above its allowance."""

    name: str
    limit_per_s: float
    windows: tuple[WindowCount, ...]

    @property
    def violation(self) -> bool:
        return any(window.exceeded for window in self.windows)


@dataclass(frozen=True)
class Verdict:
    """Every check, the outcome tallies and rates behind them, and the overall result."""

    checks: tuple[Check, ...]
    outcomes: dict[str, int]
    failed_expected: int
    operations_failed_by_provider: int
    resubmitted_after_kill: tuple[str, ...]
    rates: tuple[QueueRate, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def problems(self) -> list[str]:
        return [example for check in self.checks for example in check.examples]

    def check(self, name: str) -> Check:
        """The check called `name`."""
        return next(check for check in self.checks if check.name == name)


def judge(run: ChaosRun) -> Verdict:
    """Judge a run: loss, outcomes, duplicates, early retries, rates, read model, kills."""
    items = run.items
    rates = tuple(queue_rate(queue) for queue in run.queues)
    resubmitted, duplicates = resubmits(items, run.kill_times)
    checks = (
        Check("enqueue_refused", len(run.enqueue_refusals), run.enqueue_refusals),
        lost(items),
        failed_unexpected(items),
        sent_but_provider_failed(items),
        duplicates,
        early_requests(items, run.kill_times),
        rate_violations(rates),
        readmodel_mismatches(items),
        worker_kills(len(run.kill_times), run.kills_planned),
    )
    return Verdict(
        checks=checks,
        outcomes=dict(Counter(item.outcome for item in items)),
        failed_expected=sum(item.outcome == "failed" and item.provider_failed for item in items),
        operations_failed_by_provider=sum(item.provider_failed for item in items),
        resubmitted_after_kill=resubmitted,
        rates=rates,
    )


def lost(items: Sequence[ItemEvidence]) -> Check:
    """Items not final by the deadline, or `sent` though the provider never accepted them."""
    examples = []
    for item in items:
        if item.outcome not in FINAL_STATUSES:
            examples.append(f"{item.item_id}: lost, not final ({item.outcome})")
        elif item.outcome == "sent" and item.deliveries == 0:
            examples.append(f"{item.item_id}: lost, sent but never accepted by the provider")
    return Check("lost", len(examples), tuple(examples))


def failed_unexpected(items: Sequence[ItemEvidence]) -> Check:
    """Items that failed although the provider never failed their operation."""
    examples = [
        f"{item.item_id}: failed unexpectedly: {item.last_error}"
        for item in items
        if item.outcome == "failed" and not item.provider_failed
    ]
    return Check("failed_unexpected", len(examples), tuple(examples))


def sent_but_provider_failed(items: Sequence[ItemEvidence]) -> Check:
    """Items reported `sent` whose operation the provider failed."""
    examples = [
        f"{item.item_id}: sent, but the provider failed its operation"
        for item in items
        if item.outcome == "sent" and item.deliveries > 0 and item.provider_failed
    ]
    return Check("sent_but_provider_failed", len(examples), tuple(examples))


def resubmits(
    items: Sequence[ItemEvidence], kill_times: Sequence[float]
) -> tuple[tuple[str, ...], Check]:
    """Accepted re-submits after a worker kill (harmless), and the duplicates check.

    A duplicate is a key the deduping provider delivered more than once, or a key it accepted
    again with no worker kill since its first acceptance. A worker killed after the provider
    accepted but before Temporal heard of it must submit again; the idempotency key makes that
    harmless. Anything else is a bug.
    """
    resubmitted: list[str] = []
    examples: list[str] = []
    count = 0
    for item in items:
        if item.deliveries > 1:
            count += 1
            examples.append(f"{item.item_id}: delivered {item.deliveries} times")
        accepted = sorted(
            (answer for answer in item.answers if answer.accepted), key=lambda a: a.arrived_at
        )
        for again in accepted[1:]:
            first = accepted[0].arrived_at
            if any(first <= kill <= again.arrived_at for kill in kill_times):
                resubmitted.append(f"{item.item_id}: {trail(item.answers, kill_times)}")
            else:
                count += 1
                examples.append(
                    f"{item.item_id}: accepted again {again.arrived_at - first:.1f} s after its "
                    "first acceptance with no worker kill in between"
                )
    return tuple(resubmitted), Check("duplicates", count, tuple(examples))


def retry_not_before(answered_at: float, retry_after: str) -> float | None:
    """The earliest a retry may arrive after an answer with this `Retry-After` (RFC 9110:
    delta-seconds from the answer, or an HTTP-date); None when the header is malformed."""
    value = retry_after.strip()
    if value.isdigit():
        return answered_at + float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    # A date without a zone ("-0000") is UTC, as the delivery client reads it; never local time.
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def early_attempts(answers: Sequence[SubmitAnswer]) -> int:
    """Submits that arrived before a Retry-After the provider had already answered this key."""
    early = 0
    ordered = sorted(answers, key=lambda answer: answer.arrived_at)
    for index, attempt in enumerate(ordered):
        # Only answers given before this request arrived can bind it; overlapping ones cannot.
        bounds = [
            retry_not_before(earlier.answered_at, earlier.retry_after)
            for earlier in ordered[:index]
            if earlier.retry_after is not None and earlier.answered_at <= attempt.arrived_at
        ]
        if any(bound is not None and attempt.arrived_at < bound for bound in bounds):
            early += 1
    return early


def early_requests(items: Sequence[ItemEvidence], kill_times: Sequence[float]) -> Check:
    """Submits before the provider's Retry-After, counted per request."""
    count = 0
    examples = []
    for item in items:
        early = early_attempts(item.answers)
        if early:
            count += early
            examples.append(
                f"{item.item_id}: {early} request(s) before a Retry-After; "
                + trail(item.answers, kill_times)
            )
    return Check("early_requests", count, tuple(examples))


def busiest_window(times: Sequence[float], window_s: float) -> int:
    """Most requests inside any half-open window [t, t + window_s) that starts at a request."""
    ordered = sorted(times)
    return max(
        (
            bisect.bisect_left(ordered, start + window_s) - index
            for index, start in enumerate(ordered)
        ),
        default=0,
    )


def queue_rate(queue: QueueTraffic) -> QueueRate:
    """A queue's busiest window of each length in `RATE_WINDOWS_S`, against its allowance."""
    windows = tuple(
        WindowCount(
            window_s,
            busiest_window(queue.request_times, window_s),
            math.floor(queue.limit_per_s * (window_s + BURST_S)),
        )
        for window_s in RATE_WINDOWS_S
    )
    return QueueRate(queue.name, queue.limit_per_s, windows)


def rate_violations(rates: Sequence[QueueRate]) -> Check:
    """Queues with a window above their rate plus the server's burst, one count per queue."""
    examples = [describe_violation(rate) for rate in rates if rate.violation]
    return Check("rate_violations", len(examples), tuple(examples))


def describe_violation(rate: QueueRate) -> str:
    """E.g. `q: 11 requests in 1 s / 40 in 10 s, above 10 / 55`."""
    busiest = " / ".join(f"{w.busiest} in {w.window_s:g} s" for w in rate.windows)
    allowed = " / ".join(str(w.allowed) for w in rate.windows)
    return f"{rate.name}: {busiest.replace(' in ', ' requests in ', 1)}, above {allowed}"


def readmodel_mismatches(items: Sequence[ItemEvidence]) -> Check:
    """Final items whose read-model status is not their workflow's."""
    examples = [
        f"{item.item_id}: {item.outcome}, but the read model says {item.read_model_status}"
        for item in items
        if item.outcome in FINAL_STATUSES and item.read_model_status != item.outcome
    ]
    return Check("readmodel_mismatches", len(examples), tuple(examples))


def worker_kills(happened: int, planned: int) -> Check:
    """Kills planned but not done before the run ended: the run did not test what it claims."""
    missing = max(0, planned - happened)
    examples = (
        (f"only {happened} of {planned} worker kills happened before the end",) if missing else ()
    )
    return Check("worker_kills", missing, examples)


def trail(answers: Sequence[SubmitAnswer], kill_times: Sequence[float]) -> str:
    """An item's submit answers and the worker kills, in seconds after its first request."""
    if not answers:
        return "no submit seen"
    ordered = sorted(answers, key=lambda answer: answer.arrived_at)
    first = ordered[0].arrived_at
    seen = [
        f"{a.arrived_at - first:+.2f}s {a.status} {a.retry_after or ''}".strip() for a in ordered
    ]
    killed = [f"{kill - first:+.2f}s" for kill in kill_times]
    return f"answers: {', '.join(seen)}; kills: {', '.join(killed)}"
