"""When to call again after a 429 or a 503: as the API's `Retry-After` says, within bounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_outbox_rest.errors import ProblemError


@dataclass(frozen=True)
class RetryPolicy:
    """Retry answers the API gives to be retried, waiting what their `Retry-After` asks.

    Safe for enqueues and commands: the client always sends them with an Idempotency-Key, so a
    repeat never creates a second item or applies a command twice.
    """

    # Calls in all, the first included.
    attempts: int = 3
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))
    # The wait when the answer gives no `Retry-After`.
    default_delay_s: float = 1.0
    # An answer asking for a longer wait is raised at once rather than waited out.
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.default_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must not be negative")

    def delay(self, error: ProblemError, attempt: int) -> float | None:
        """Seconds to wait before call `attempt + 1` after `error`; None: raise it."""
        if error.status not in self.statuses or attempt >= self.attempts:
            return None
        wait = self.default_delay_s if error.retry_after is None else error.retry_after
        return wait if wait <= self.max_delay_s else None


# No retries: every error is raised as it comes.
NO_RETRY = RetryPolicy(attempts=1)
