"""Rule: under a backlog, an item's `priority` (1 first, 5 last; 3 unset) decides who goes next.

Where it holds:

- Item mode and item-mode lanes: Temporal's priority keys. The item's workflow starts with its
  priority and its submit and poll activities carry it, so the workflow task queue and the
  destination's rate-limited queues hand out lower numbers first. The server orders each of a
  queue's partitions (4 by default) on its own, so the order across a whole queue is close,
  not exact; fairness between outboxes applies within one priority.
- Bulk mode: the shard's own order, exact within the shard. A delivery waiting for a slot (at
  most `MAX_OUT` out) and a request waiting for a batch go lowest number first, in arrival
  order within one priority; a batch activity carries its most urgent request's priority. An
  item more urgent than the default may take one of `URGENT_ROOM` slots beyond `MAX_OUT`, so
  it does not wait for the backlog's activities to come back before it is even scheduled.
- Each worker process hands out its pacing slots (`pacing`) most urgent first too.

Nothing is starved: a priority only orders what is waiting, and the rate drains the queue.
"""

from __future__ import annotations

HIGHEST_PRIORITY = 1
LOWEST_PRIORITY = 5
# Temporal's own default: an item without a priority sorts with the 3s.
DEFAULT_PRIORITY = 3


def rank(priority: int | None) -> int:
    """The number an item sorts by (an unset priority is the default)."""
    return DEFAULT_PRIORITY if priority is None else priority
