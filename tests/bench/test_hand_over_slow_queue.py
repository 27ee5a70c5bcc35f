"""The slow-queue hand-over scenario's accounting (`bench/hand_over_slow_queue.py`): an item the
provider took twice or never is counted, and any fails the run."""

from __future__ import annotations

from bench.hand_over_slow_queue import any_lost_or_doubled, sent_twice_or_never, summary


def test_an_item_sent_twice_and_one_never_sent_are_each_counted() -> None:
    assert sent_twice_or_never([0, 1, 1, 3, 3, 3], 4) == {"sent_twice": 2, "not_sent": 1}
    assert sent_twice_or_never([2, 0, 1], 3) == {"sent_twice": 0, "not_sent": 0}


def test_each_way_is_summed_over_its_rounds_and_any_loss_fails_the_run() -> None:
    def round_(rate: float, twice: int = 0, never: int = 0) -> dict[str, float | int]:
        return {
            "items_per_s": rate,
            "taken_back": 3,
            "events_per_item": 6.0,
            "runs": 6,
            "sent_twice": twice,
            "not_sent": never,
        }

    figures = summary({"grace": [round_(9.0), round_(8.0), round_(10.0)]})
    assert figures["grace"]["items_per_s"] == [9.0, 8.0, 10.0]
    assert figures["grace"]["items_per_s_median"] == 9.0
    assert figures["grace"]["taken_back"] == [3, 3, 3]
    assert not any_lost_or_doubled({"grace": figures["grace"]})

    doubled = summary({"grace": [round_(9.0), round_(9.0, twice=1)]})
    assert any_lost_or_doubled(doubled)
    lost = summary({"grace": [round_(9.0, never=2)]})
    assert lost["grace"]["not_sent"] == 2 and any_lost_or_doubled(lost)
