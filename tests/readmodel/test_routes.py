"""Bulk mode's routes (`readmodel/routes.py`) on SQLite and on PostgreSQL: an owner keeps the
count of its first hand-over whoever claims it after, concurrent claims agree, lanes handed over
before routes get theirs, and retention drops a route only with what it routes."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.lane import LanePolicy, LaneProjection, LaneStatus, LaneView
from sqlalchemy import Engine, select

from readmodel import routes
from readmodel.lanes import apply_lane_projections
from readmodel.models import BULK_ROUTES, ITEMS
from readmodel.retention import prune_idle_lanes, prune_rows
from tests.readmodel.test_retention import DAY, NOW, RULE, item


def test_an_owner_keeps_the_count_of_its_first_hand_over(engine: Engine) -> None:
    first = routes.claim(engine, "d", ["lane/o/k", "outbox/o/a"], 4, now=NOW)
    assert first == {"lane/o/k": 4, "outbox/o/a": 4}
    # A process configured with 8 (a rolling restart): known owners keep 4, a new one takes 8;
    # an owner named twice in one hand-over is claimed once.
    later = routes.claim(engine, "d", ["lane/o/k", "lane/o/k", "outbox/o/b"], 8, now=NOW + DAY)
    assert later == {"lane/o/k": 4, "outbox/o/b": 8}
    assert routes.find(engine, "d", "lane/o/k") == 4
    assert routes.find(engine, "d", "lane/o/none") is None
    # Routes are per destination.
    assert routes.claim(engine, "other", ["lane/o/k"], 2, now=NOW) == {"lane/o/k": 2}
    # Each claim marks the route claimed then (retention keeps a lane's route claimed lately).
    with engine.connect() as connection:
        claimed = connection.execute(
            select(BULK_ROUTES.c.claimed_at).where(
                BULK_ROUTES.c.destination == "d", BULK_ROUTES.c.owner == "lane/o/k"
            )
        ).scalar_one()
    assert claimed == NOW + DAY
    assert routes.claim(engine, "d", [], 4) == {}


def test_concurrent_claims_under_different_counts_agree(engine: Engine) -> None:
    # Processes configured with 4 and 8 claim the same owners at once: each owner gets one count,
    # the same for every claimer.
    owners = [f"lane/o/k{n}" for n in range(30)]
    results: list[dict[str, int]] = []
    start = threading.Barrier(6)

    def claimer(count: int) -> None:
        start.wait()
        for _ in range(5):
            results.append(routes.claim(engine, "d", list(reversed(owners)), count))

    threads = [threading.Thread(target=claimer, args=(4 if n % 2 else 8,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 30
    assert all(result == results[0] for result in results)
    assert set(results[0].values()) <= {4, 8}


def lane(
    engine: Engine,
    key: str,
    status: LaneStatus,
    updated_days_ago: float = 0,
    destination: str = "d",
    now: datetime = NOW,
) -> str:
    """A bulk lane's row in outbox `o`, last changed that many days before `now`; its id."""
    at = now - updated_days_ago * DAY
    lane_id = f"lane/o/{key}"
    apply_lane_projections(
        engine,
        [
            LaneProjection(
                LaneView(
                    id=lane_id,
                    outbox="o",
                    ordering_key=key,
                    status=status,
                    policy=LanePolicy.HALT,
                    destination=destination,
                    length=0 if status is LaneStatus.IDLE else 2,
                    updated_at=at,
                    version=int(at.timestamp() * 1_000_000),
                )
            )
        ],
    )
    return lane_id


def test_held_lanes_without_routes_are_named_then_given_theirs(engine: Engine) -> None:
    running = lane(engine, "running", LaneStatus.RUNNING)
    halted = lane(engine, "halted", LaneStatus.HALTED)
    lane(engine, "idle", LaneStatus.IDLE)
    routed = lane(engine, "routed", LaneStatus.RUNNING)
    routes.claim(engine, "d", [routed], 2, now=NOW)

    assert routes.unrouted_held(engine, "d", NOW) == (2, sorted([halted, running]))
    assert routes.unrouted_held(engine, "other", NOW) == (0, [])
    assert routes.route_held_lanes(engine, "d", 4, now=NOW) == 2
    assert routes.unrouted_held(engine, "d", NOW) == (0, [])
    # A routed lane keeps its count; an idle one gets none (its next items take the count
    # configured then).
    assert routes.find(engine, "d", routed) == 2
    assert routes.find(engine, "d", running) == 4
    assert routes.find(engine, "d", "lane/o/idle") is None
    assert routes.route_held_lanes(engine, "d", 4, now=NOW) == 0


def test_many_unrouted_lanes_are_counted_and_a_few_named(engine: Engine) -> None:
    for n in range(routes.NAMED + 3):
        lane(engine, f"k{n:02}", LaneStatus.RUNNING)
    count, named = routes.unrouted_held(engine, "d", NOW)
    assert count == routes.NAMED + 3
    assert named == [f"lane/o/k{n:02}" for n in range(routes.NAMED)]


def test_an_idle_lanes_route_goes_with_its_row_unless_claimed_since_the_cutoff(
    engine: Engine,
) -> None:
    quiet = lane(engine, "quiet", LaneStatus.IDLE, updated_days_ago=5)
    claimed = lane(engine, "claimed", LaneStatus.IDLE, updated_days_ago=5)
    busy = lane(engine, "busy", LaneStatus.RUNNING, updated_days_ago=5)
    routes.claim(engine, "d", [quiet, claimed, busy], 4, now=NOW - 5 * DAY)
    # A hand-over claimed this lane after the cutoff: its items are on their way to the shard
    # the route names, whatever the row still says.
    routes.claim(engine, "d", [claimed], 8, now=NOW - timedelta(hours=1))

    assert prune_idle_lanes(engine, NOW - 2 * DAY, limit=10).pruned == 2
    assert routes.find(engine, "d", quiet) is None
    assert routes.find(engine, "d", claimed) == 4
    assert routes.find(engine, "d", busy) == 4


def test_routes_left_without_an_owner_go_on_the_last_page_of_lanes(engine: Engine) -> None:
    # A hand-over that failed after its claim and was never sent again: an item that never had
    # a row, a lane that never had one, and a lane whose idle row went while a hand-over had
    # claimed it (that hand-over failed too).
    never_item, never_lane = "outbox/o/never", "lane/o/never"
    kept_lane = lane(engine, "kept", LaneStatus.IDLE, updated_days_ago=5)
    routes.claim(engine, "d", [never_item, never_lane, kept_lane], 4, now=NOW - 5 * DAY)
    routes.claim(engine, "d", [kept_lane], 4, now=NOW - 3 * DAY)
    # Owners that have rows, and a route claimed since the cutoff (a hand-over on its way).
    item(engine, "held", ItemStatus.QUEUED, ended_days_ago=None)
    busy = lane(engine, "busy", LaneStatus.RUNNING, updated_days_ago=5)
    routes.claim(engine, "d", ["outbox/o/held", busy], 4, now=NOW - 5 * DAY)
    routes.claim(engine, "d", ["outbox/o/recent"], 4, now=NOW - timedelta(hours=1))

    # The lane's row goes, its route stays: it was claimed since the first cutoff.
    assert prune_idle_lanes(engine, NOW - 4 * DAY, limit=10).pruned == 1
    assert routes.find(engine, "d", kept_lane) == 4
    assert routes.find(engine, "d", never_item) is None
    assert routes.find(engine, "d", never_lane) is None
    # A later run, past that claim: the route with no lane row goes now.
    assert prune_idle_lanes(engine, NOW - 2 * DAY, limit=10).pruned == 0
    assert routes.find(engine, "d", kept_lane) is None
    for owner in ("outbox/o/held", busy, "outbox/o/recent"):
        assert routes.find(engine, "d", owner) == 4


def test_orphan_routes_wait_for_the_runs_last_page_of_lanes(engine: Engine) -> None:
    for n in range(3):
        lane(engine, f"idle{n}", LaneStatus.IDLE, updated_days_ago=5)
    routes.claim(engine, "d", ["outbox/o/never"], 4, now=NOW - 5 * DAY)
    first = prune_idle_lanes(engine, NOW - 2 * DAY, limit=2)
    assert (first.pruned, first.more) == (2, True)
    assert routes.find(engine, "d", "outbox/o/never") == 4
    last = prune_idle_lanes(engine, NOW - 2 * DAY, limit=2, after=first.last)
    assert (last.pruned, last.more) == (1, False)
    assert routes.find(engine, "d", "outbox/o/never") is None


def test_an_unordered_items_route_goes_with_its_row(engine: Engine) -> None:
    # Until then a repeat of the item's hand-over finds its shard by the route; after, the key's
    # memory answers the repeat before anything is handed over.
    item(engine, "gone", ItemStatus.SENT, ended_days_ago=3)
    item(engine, "kept", ItemStatus.QUEUED, ended_days_ago=None)
    routes.claim(engine, "d", ["outbox/o/gone", "outbox/o/kept"], 4, now=NOW - 3 * DAY)
    routes.claim(engine, "other", ["outbox/o/gone"], 4, now=NOW - 3 * DAY)

    assert prune_rows(engine, RULE, NOW - DAY, limit=10, now=NOW).pruned == 1
    assert routes.find(engine, "d", "outbox/o/gone") is None
    assert routes.find(engine, "d", "outbox/o/kept") == 4
    # Another destination's route of the same id is not this rule's.
    assert routes.find(engine, "other", "outbox/o/gone") == 4


def test_unordered_items_from_before_their_count_was_recorded_are_named(engine: Engine) -> None:
    # Their cancels and reports go by the configured count: while such an item is queued,
    # sending or listening for reports, another count would send those elsewhere.
    item(engine, "queued", ItemStatus.QUEUED, ended_days_ago=None)
    item(engine, "listening", ItemStatus.SENT, ended_days_ago=0.5)
    item(engine, "done", ItemStatus.SENT, ended_days_ago=3)
    assert routes.unrouted_held(engine, "d", NOW - DAY) == (
        2,
        ["outbox/o/listening", "outbox/o/queued"],
    )
    with engine.begin() as connection:
        connection.execute(ITEMS.update().values(shards=4))
    assert routes.unrouted_held(engine, "d", NOW - DAY) == (0, [])
