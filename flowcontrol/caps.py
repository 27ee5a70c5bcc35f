"""Rules: concurrency caps and multi-window quotas, per destination and per `concurrency_key`.

- **Caps** (`max_in_flight`, `key_max_in_flight`): at most N submits and polls out at the
  provider at once, for the destination and for each key (a tenant, a customer).
- **Quotas** (`quotas`, `key_quotas`): at most `max` submits in any sliding window of `per`
  (providers publish limits per second and per minute, hour or day), for the destination and
  for each key: a rate per key is a quota of `{per = "1s", max = …}` in `key_quotas`.

Where they hold: each submit and poll activity takes its permits (and records its submit)
in the read model's database just before the request (`readmodel.permits`), the same in item
mode, in bulk shards and in lanes. So they are exact across every worker process that shares
the database, whichever host the item is in. A request that cannot go within its activity's
time is handed back to its item as held
(`durable_outbox_temporal.contract.item.ItemErrorType.HELD`), which waits and asks again without
spending an attempt. A worker killed mid-request holds its permits until their lease (the request's
timeout and a margin) ends.

Caps and quotas changed at run time (`readmodel.flow_overrides`) apply to each request that
starts once its worker has read them again (every couple of seconds); requests already out
keep the permits they took.

This module is pure: which scopes a request needs, and their limits.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import timedelta

from durable_outbox_temporal.contract.flow_policy import FlowPolicy

# A permit outlives its request's timeout by this much before it counts as lost.
LEASE_MARGIN = timedelta(seconds=5)
# A key longer than this is named in a scope by a hash (scopes are at most 255 characters).
_KEY_IN_SCOPE = 100

Windows = tuple[tuple[timedelta, int], ...]


def _key(key: str) -> str:
    if len(key) <= _KEY_IN_SCOPE:
        return key
    return f"{key[:40]}~{hashlib.sha256(key.encode()).hexdigest()[:32]}"


@dataclass(frozen=True)
class FlowLimits:
    """One destination's caps and quotas, as a worker process applies them."""

    destination: str
    max_in_flight: int | None = None
    key_max_in_flight: int | None = None
    quotas: Windows = ()
    key_quotas: Windows = ()
    # How long a permit is held at most (a process killed mid-request never returns it): the
    # longest activity of the destination and `LEASE_MARGIN`.
    lease: timedelta = timedelta(seconds=35)
    # The time a request needs: an activity waits for its permits only while it has this left.
    request: timedelta = timedelta(seconds=10)

    @classmethod
    def of(
        cls, destination: str, policy: FlowPolicy, activity_timeout_s: float, request_s: float
    ) -> FlowLimits:
        return cls(
            destination=destination,
            lease=timedelta(seconds=activity_timeout_s) + LEASE_MARGIN,
            request=timedelta(seconds=request_s),
        ).under(policy)

    def under(self, policy: FlowPolicy) -> FlowLimits:
        """These limits with `policy`'s caps and quotas (one changed at run time, say)."""
        return dataclasses.replace(
            self,
            max_in_flight=policy.max_in_flight,
            key_max_in_flight=policy.key_max_in_flight,
            quotas=tuple((quota.window, quota.max) for quota in policy.quotas),
            key_quotas=tuple((quota.window, quota.max) for quota in policy.key_quotas),
        )

    @property
    def active(self) -> bool:
        return bool(self.max_in_flight or self.key_max_in_flight or self.quotas or self.key_quotas)

    def permits(self, key: str | None) -> list[tuple[str, int]]:
        """The permit scopes a request of `key` needs, with their limits."""
        found = []
        if self.max_in_flight:
            found.append((f"inflight/{self.destination}", self.max_in_flight))
        if self.key_max_in_flight and key is not None:
            found.append((f"inflight/{self.destination}/{_key(key)}", self.key_max_in_flight))
        return found

    def submits(self, key: str | None) -> list[tuple[str, Windows]]:
        """The quota scopes a submit of `key` counts in, with their windows."""
        found = []
        if self.quotas:
            found.append((f"quota/{self.destination}", self.quotas))
        if self.key_quotas and key is not None:
            found.append((f"quota/{self.destination}/{_key(key)}", self.key_quotas))
        return found

    def holding(self, scope: str, key: str | None) -> str:
        """What a full `scope` of a request of `key` is, in words (`waiting_on`, held items)."""
        of_key = key is not None and scope.count("/") > 1
        if scope.startswith("inflight/"):
            limit = self.key_max_in_flight if of_key else self.max_in_flight
            whose = f"key {key!r}" if of_key else f"destination {self.destination}"
            return f"the concurrency cap of {whose} ({limit} out at once)"
        windows = self.key_quotas if of_key else self.quotas
        shown = ", ".join(f"{most} per {per.total_seconds():g} s" for per, most in windows)
        whose = f"key {key!r}" if of_key else f"destination {self.destination}"
        return f"the quota of {whose} ({shown})"

    def key_permits(self) -> tuple[str, int] | None:
        """The scope every key's permits sit under (`scope/<key>`), with each key's limit."""
        if not self.key_max_in_flight:
            return None
        return f"inflight/{self.destination}", self.key_max_in_flight

    def key_submits(self) -> tuple[str, Windows] | None:
        """The scope every key's quota windows sit under, with each key's windows."""
        if not self.key_quotas:
            return None
        return f"quota/{self.destination}", self.key_quotas

    def holding_scope(self, scope: str) -> str:
        """`holding` of a scope found full, its key (if any) read from its name."""
        parts = scope.split("/", 2)
        return self.holding(scope, parts[2] if len(parts) == 3 else None)
