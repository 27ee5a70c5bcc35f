"""What a lane may carry: its waiting items' keys and payloads, and each item's own fields."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from durable_outbox_temporal.codec import data_converter
from durable_outbox_temporal.contract.lane import (
    LANE_ENTRY_BYTES,
    LANE_MAX_WAITING_BYTES,
    LaneEntry,
    LanePolicy,
    LaneStatus,
    LaneView,
    entry_size,
    over_capacity,
)
from durable_outbox_temporal.errors import LaneFull
from durable_outbox_temporal.lanes import check_capacity


def test_an_entrys_own_fields_fit_in_what_each_item_is_counted() -> None:
    converter = data_converter(None).payload_converter
    now = datetime.now(UTC)
    redriven = LaneEntry(
        key="",
        destination="d" * 20,
        payload={},
        enqueued_at=now,
        max_attempts=5,
        generation=3,
        last_event_seq=12,
        created_at=now,
        enqueue_projected=True,
    )
    assert len(converter.to_payload(redriven).data) <= LANE_ENTRY_BYTES


def test_tiny_items_fill_a_lane_by_their_count() -> None:
    size = entry_size("t1", {"n": 1})
    fits = (LANE_MAX_WAITING_BYTES - size) // (size + LANE_ENTRY_BYTES)
    assert not over_capacity(fits * size, fits - 1, size)
    assert over_capacity((fits + 1) * size, fits + 1, size)
    # Keys and payloads alone would have taken about twenty times as many.
    assert LANE_MAX_WAITING_BYTES // size > 20 * fits


@pytest.mark.parametrize(("length", "refused"), [(3700, False), (3900, True)])
def test_the_clients_check_counts_each_waiting_item(length: int, refused: bool) -> None:
    lane = LaneView(
        id="lane/o/k",
        outbox="o",
        ordering_key="k",
        status=LaneStatus.RUNNING,
        policy=LanePolicy.HALT,
        length=length,
        waiting_bytes=length * 13,
    )
    if refused:
        with pytest.raises(LaneFull, match="250 an item"):
            check_capacity(lane, 13)
    else:
        check_capacity(lane, 13)
