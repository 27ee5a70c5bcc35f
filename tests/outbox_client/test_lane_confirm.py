"""An append counts only once its lane has recorded it (outbox_client/lanes.py `_confirm`)."""

from __future__ import annotations

from typing import Any

from contract.lane import AppendOutcome
from outbox_client.lanes import _confirm


class Lane:
    """Answers the outcome query from a script; counts the appends sent again."""

    def __init__(self, *answers: AppendOutcome) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.resent = 0

    async def query(self, name: str, append_id: str, **kwargs: Any) -> AppendOutcome:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def send(self) -> None:
        self.resent += 1


async def test_pending_is_asked_again_until_recorded() -> None:
    lane = Lane(AppendOutcome.PENDING, AppendOutcome.PENDING, AppendOutcome.QUEUED)
    assert await _confirm(lane, "a-1", lane.send) is AppendOutcome.QUEUED  # type: ignore[arg-type]
    assert (lane.asked, lane.resent) == (3, 0)


async def test_an_append_the_lane_lost_is_sent_again() -> None:
    # Pending in the run that took it, unknown in the run it continued as (it was left behind).
    lane = Lane(AppendOutcome.PENDING, AppendOutcome.UNKNOWN, AppendOutcome.QUEUED)
    assert await _confirm(lane, "a-1", lane.send) is AppendOutcome.QUEUED  # type: ignore[arg-type]
    assert lane.resent == 1


async def test_resends_are_bounded_and_a_lane_that_never_knows_is_unknown() -> None:
    lane = Lane(AppendOutcome.UNKNOWN)
    assert await _confirm(lane, "a-1", lane.send) is AppendOutcome.UNKNOWN  # type: ignore[arg-type]
    assert lane.resent == 3


async def test_duplicates_and_conflicts_are_answers_at_once() -> None:
    for answer in (AppendOutcome.DUPLICATE, AppendOutcome.CONFLICT):
        lane = Lane(answer)
        assert await _confirm(lane, "a-1", lane.send) is answer  # type: ignore[arg-type]
        assert (lane.asked, lane.resent) == (1, 0)
