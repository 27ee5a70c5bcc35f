"""What the caps and quotas cost per request (`python -m bench.flow_ledger`): taking two
permits (the destination's and a key's), recording a submit in two quota windows, settling it
once answered and returning the permits, on SQLite and on PostgreSQL (`READMODEL_POSTGRES_URL`,
default the local `test` database), one process, in alternating rounds (`readmodel/permits.py`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from readmodel.db import create_schema, make_engine
from readmodel.permits import return_permits, settle_requests, take_permits, take_requests

ROUNDS = 3
PER_ROUND = 200
POSTGRES_URL = os.environ.get(
    "READMODEL_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
PERMITS = [("inflight/d", 1_000_000), ("inflight/d/tenant", 1_000_000)]
QUOTAS = [("quota/d", [(timedelta(seconds=1), 10**9), (timedelta(hours=1), 10**9)])]


def one_round(engine: Engine) -> float:
    """Milliseconds per request over `PER_ROUND` requests."""
    began = time.perf_counter()
    for _ in range(PER_ROUND):
        now, holder = datetime.now(UTC), uuid.uuid4().hex
        assert take_permits(engine, PERMITS, holder, now, timedelta(seconds=30)) is None
        _, recorded = take_requests(engine, QUOTAS, now, now + timedelta(seconds=30))
        settle_requests(engine, recorded, datetime.now(UTC))
        return_permits(engine, [scope for scope, _ in PERMITS], holder)
    return (time.perf_counter() - began) / PER_ROUND * 1000


@contextmanager
def engines() -> Iterator[dict[str, Engine]]:
    schema = f"bench_ledger_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as directory:
        sqlite = make_engine(f"sqlite:///{Path(directory) / 'ledger.db'}")
        admin = make_engine(POSTGRES_URL)
        with admin.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        separator = "&" if "?" in POSTGRES_URL else "?"
        postgres = make_engine(f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}")
        try:
            for engine in (sqlite, postgres):
                create_schema(engine)
            yield {"sqlite": sqlite, "postgres": postgres}
        finally:
            sqlite.dispose()
            postgres.dispose()
            with admin.begin() as connection:
                connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            admin.dispose()


def main() -> None:
    with engines() as found:
        rounds: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(ROUNDS):
            for name, engine in found.items():
                rounds[name].append(one_round(engine))
    for name, figures in rounds.items():
        shown = ", ".join(f"{figure:.2f}" for figure in figures)
        print(f"ledger_ms_per_request[{name}]: {statistics.median(figures):.2f} ({shown})")


if __name__ == "__main__":
    main()
