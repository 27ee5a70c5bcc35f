"""The `outbox` label of the API's metrics, bounded: the outboxes in `METRICS_OUTBOXES`, plus the
most active others up to `METRICS_OUTBOX_LABELS`; every other outbox counts as `other`.

Whoever may enqueue can name new outboxes, and each name would otherwise add its own series to
every per-outbox metric. An outbox earns its label while there is room: when this API takes an
item into it (or tries to), or from a backlog reading (a `/metrics` scrape), which admits the
most active in the read model (items held, sent and failed) first. It keeps its label for the
life of the process, so a series never flips back to `other`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

OTHER = "other"


class OutboxLabels:
    """Which outboxes get their own label; the rest are `OTHER`."""

    def __init__(self, configured: Iterable[str] = (), cap: int = 50) -> None:
        self.configured = frozenset(configured)
        self.cap = cap
        self._admitted: set[str] = set()

    def label(self, outbox: str) -> str:
        """The label `outbox` is counted under."""
        if outbox in self.configured or outbox in self._admitted:
            return outbox
        return OTHER

    def admit(self, outbox: str) -> None:
        """Give `outbox` (which just took an item, or was asked to) its label, if there is room."""
        if len(self._admitted) < self.cap and self.label(outbox) == OTHER and outbox != OTHER:
            self._admitted.add(outbox)

    def admit_most_active(self, activity: Mapping[str, int]) -> None:
        """Give the most active outboxes without a label one, while fewer than `cap` have."""
        room = self.cap - len(self._admitted)
        if room <= 0:
            return
        candidates = [
            (-count, outbox)
            for outbox, count in activity.items()
            if outbox not in self.configured and outbox not in self._admitted and outbox != OTHER
        ]
        for _, outbox in sorted(candidates)[:room]:
            self._admitted.add(outbox)
