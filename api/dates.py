"""Dates as the API takes them, in queries and bodies alike: converted to UTC and refused (422)
when that leaves years 1-9999, which Python's `datetime` (and so the read model) cannot hold.

`0001-01-01T00:00:00+14:00` is a valid RFC 3339 date whose UTC instant falls in year 0; taken
as is, it fails only deep inside a query or a workflow.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime

OUT_OF_RANGE = "must fall within years 1 to 9999 once converted to UTC"


def in_utc(value: datetime) -> datetime:
    """`value` in UTC (a time without offset is UTC); raises `ValueError` outside years 1-9999."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(OUT_OF_RANGE) from None


# A date with or without offset (without: UTC), as UTC.
UtcDatetime = Annotated[datetime, AfterValidator(in_utc)]
# A date that must carry its offset (RFC 3339), as UTC.
AwareUtcDatetime = Annotated[AwareDatetime, AfterValidator(in_utc)]
