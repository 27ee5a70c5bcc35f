"""The judge of `bench.reshard` and the destinations file it writes: a clean run passes, each
check fails exactly its own defect, and each generation's environment gives its own count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_outbox_temporal.contract.bulk import shard_of
from durable_outbox_temporal.contract.ids import (
    item_workflow_id,
    lane_workflow_id,
    provider_idempotency_key,
)
from starlette.types import Receive, Scope, Send

from bench.chaos import SubmitAnswers
from bench.chaos_analysis import SubmitAnswer
from bench.reshard import (
    DESTINATION,
    LANE_ITEMS,
    NEW_SHARDS,
    OLD_SHARDS,
    OUTBOX,
    SHARDS_VARIABLE,
    Sent,
    coverage_problems,
    destinations_toml,
    judge,
    lanes_across_counts,
    ordered_item_key,
    unordered_item_key,
)
from configuration.destinations import load_destinations

T0 = 1_800_000_000.0
LANES = ("p0-l0", "p1-l0")
UNORDERED = 3


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("not served")


def provider_key(key: str) -> str:
    return provider_idempotency_key(item_workflow_id(OUTBOX, key))


def clean_run() -> tuple[Sent, list[dict[str, Any]], SubmitAnswers]:
    """Two lanes' items interleaved and three unordered items, each accepted once, a second
    apart."""
    log: list[dict[str, Any]] = []
    answers = SubmitAnswers(_no_app)

    def arrive(key: str, payload: dict[str, Any]) -> None:
        at = T0 + len(log)
        log.append({"endpoint": DESTINATION, "payload": payload, "at": at})
        answers.by_key[provider_key(key)].append(SubmitAnswer(at, at + 0.01, 204))

    for i in range(LANE_ITEMS):
        for lane in LANES:
            arrive(ordered_item_key(lane, i), {"lane": lane, "i": i})
    for n in range(UNORDERED):
        arrive(unordered_item_key(n), {"u": n})
    return Sent(LANES, UNORDERED), log, answers


def test_a_clean_run_passes() -> None:
    sent, log, answers = clean_run()
    figures, problems = judge(sent, log, answers, kills=())
    assert problems == []
    assert figures["delivered"] == len(LANES) * LANE_ITEMS + UNORDERED
    assert (figures["lost"], figures["duplicates"], figures["out_of_order"]) == (0, 0, 0)


def test_a_lanes_items_swapped_are_out_of_order() -> None:
    sent, log, answers = clean_run()
    # Lane p0-l0's items 0 and 1 (log entries 0 and 2) swapped.
    log[0], log[2] = log[2], log[0]
    figures, problems = judge(sent, log, answers, kills=())
    assert figures["out_of_order"] == 1
    assert problems == ["1 items arrived before an item appended earlier by the same client"]


def test_an_unordered_item_missing_is_lost() -> None:
    sent, log, answers = clean_run()
    figures, problems = judge(sent, log[:-1], answers, kills=())
    assert figures["lost"] == 1
    assert problems == [f"1 of {UNORDERED} unordered items never arrived"]


def test_an_unordered_item_delivered_twice_is_a_duplicate() -> None:
    sent, log, answers = clean_run()
    figures, problems = judge(sent, [*log, log[-1]], answers, kills=())
    assert figures["duplicates"] == 1
    assert problems == ["1 unordered items arrived twice"]


def test_an_unordered_item_accepted_twice_with_no_kill_between_is_a_problem() -> None:
    sent, log, answers = clean_run()
    first = answers.by_key[provider_key(unordered_item_key(0))][0].arrived_at
    answers.by_key[provider_key(unordered_item_key(0))].append(
        SubmitAnswer(first + 5, first + 5.01, 204)
    )
    figures, problems = judge(sent, log, answers, kills=())
    assert figures["unordered_resubmits"] == 1
    assert len(problems) == 1 and "accepted twice by the provider" in problems[0]
    # The same after a worker kill between: a batch out on the killed worker sent again whole.
    figures, problems = judge(sent, log, answers, kills=(first + 2,))
    assert (figures["unordered_resubmits"], problems) == (0, [])


def test_a_run_that_never_used_both_counts_tested_nothing() -> None:
    assert coverage_problems({OLD_SHARDS: 5, NEW_SHARDS: 3}, across=1) == []
    assert coverage_problems({OLD_SHARDS: 5}, across=1) == [
        f"no owner was routed by shards = {NEW_SHARDS}"
    ]
    assert coverage_problems({OLD_SHARDS: 5, NEW_SHARDS: 3}, across=0) == [
        "no lane had items accepted by both generations' APIs where their counts place it on "
        "different shards"
    ]


def test_a_lane_crosses_counts_only_through_both_apis_where_the_counts_disagree() -> None:
    def owner(lane: str) -> str:
        return lane_workflow_id(OUTBOX, lane)

    lanes = [f"p0-l{n}" for n in range(40)]
    split = next(
        lane
        for lane in lanes
        if shard_of(owner(lane), OLD_SHARDS) != shard_of(owner(lane), NEW_SHARDS)
    )
    same = next(
        lane
        for lane in lanes
        if shard_of(owner(lane), OLD_SHARDS) == shard_of(owner(lane), NEW_SHARDS)
    )
    both, one = {"http://a", "http://b"}, {"http://a"}
    routes = {owner(split): OLD_SHARDS, owner(same): OLD_SHARDS}
    assert lanes_across_counts(routes, {split: both}) == 1
    # Through one API only, or where both counts agree on its shard: nothing crossed.
    assert lanes_across_counts(routes, {split: one, same: both}) == 0
    # A lane with no route (never handed over through the read model) is not counted.
    assert lanes_across_counts({}, {split: both}) == 0


def test_each_generations_environment_gives_its_count(tmp_path: Path) -> None:
    path = tmp_path / "destinations.toml"
    path.write_text(destinations_toml())
    env = {"FAKE_PROVIDER_URL": "http://127.0.0.1:9"}
    for shards in (OLD_SHARDS, NEW_SHARDS):
        registry = load_destinations(path, {**env, SHARDS_VARIABLE: str(shards)})
        destination = registry.get(DESTINATION)
        assert destination is not None
        assert (destination.mode, destination.shards) == ("bulk", shards)
