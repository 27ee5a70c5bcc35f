"""Alembic migrations of the read model, on SQLite and on PostgreSQL (`engine_factory`)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    insert,
    inspect,
    select,
    text,
)

from examples.labour.projectors import LABOUR_HISTORY
from readmodel.db import (
    MIGRATIONS_DIR,
    SchemaNewerThanCode,
    alembic_config,
    create_schema,
    make_engine,
    schema_lock,
    verify_schema,
)
from readmodel.models import metadata
from service.aggregate_types import load_aggregate_types

EngineFactory = Callable[[str], Engine]

# The tables as `create_schema` made them before migrations (HEAD's sqlmodel models, frozen):
# what an existing install holds, written out independently of revision 0001.
LEGACY = MetaData()
Table(
    "outbox_items",
    LEGACY,
    Column("id", String(320), primary_key=True),
    Column("outbox", String(100), nullable=False),
    Column("key", String(200), nullable=False),
    Column("destination", String(63), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("last_error", String, nullable=True),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Column("operation_url", String, nullable=True),
    Column("poll_count", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("ordering_key", String, nullable=True),
    Column("payload_hash", String, nullable=True),
    Column("provider_message_id", String, nullable=True),
    Column("payload", JSON(none_as_null=True), nullable=True),
    Column("version", Integer, nullable=False),
    Index("ix_outbox_items_outbox_created", "outbox", "created_at", "id"),
    Index("ix_outbox_items_outbox_status", "outbox", "status", "created_at", "id"),
    Index("ix_outbox_items_outbox_destination", "outbox", "destination", "created_at"),
)
Table(
    "outbox_events",
    LEGACY,
    Column("item_id", String(320), nullable=False),
    Column("outbox", String(100), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(32), nullable=False),
    Column("status", String(16), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("detail", String, nullable=True),
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    UniqueConstraint("item_id", "seq", name="uq_outbox_events_item_seq"),
    Index("ix_outbox_events_outbox_id", "outbox", "id"),
    sqlite_autoincrement=True,
)

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    return head


def versions(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())


def differences(engine: Engine, target: MetaData) -> list[Any]:
    with engine.connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), target)


def item_row(key: str, version: int) -> dict[str, Any]:
    return {
        "id": f"outbox/o/{key}",
        "outbox": "o",
        "key": key,
        "destination": "email",
        "status": "sent",
        "attempts": 1,
        "max_attempts": 8,
        "poll_count": 2,
        "created_at": AT,
        "payload": {"to": key},
        "version": version,
    }


def event_row(key: str, seq: int) -> dict[str, Any]:
    return {
        "item_id": f"outbox/o/{key}",
        "outbox": "o",
        "seq": seq,
        "type": "enqueued",
        "status": "queued",
        "at": AT,
        "attempt": 0,
    }


def test_migrations_build_the_tables_the_models_describe(engine_factory: EngineFactory) -> None:
    """An empty database upgraded to head has exactly `readmodel.models.metadata`'s schema."""
    engine = engine_factory("fresh")
    create_schema(engine)
    assert differences(engine, metadata) == []
    assert versions(engine) == [head_revision()]


def test_first_revision_is_the_schema_before_migrations(engine_factory: EngineFactory) -> None:
    """Revision 0001 builds what `create_schema` built before it, so old databases are 0001."""
    engine = engine_factory("first")
    with schema_lock(engine) as connection:
        command.upgrade(alembic_config(connection), "0001")
    assert differences(engine, LEGACY) == []


def test_database_from_before_migrations_upgrades_with_its_rows(
    engine_factory: EngineFactory,
) -> None:
    """Tables but no `alembic_version`: stamped 0001, upgraded, every row kept, `version` moved."""
    engine = engine_factory("legacy")
    LEGACY.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            insert(LEGACY.tables["outbox_items"]), [item_row("a", 3), item_row("b", 7)]
        )
        connection.execute(
            insert(LEGACY.tables["outbox_events"]),
            [event_row("a", seq) for seq in (1, 2, 3)] + [event_row("b", 1)],
        )
        event_ids = list(connection.execute(text("SELECT id FROM outbox_events")).scalars())

    create_schema(engine)

    assert versions(engine) == [head_revision()]
    assert "version" not in {c["name"] for c in inspect(engine).get_columns("outbox_items")}
    items_table = metadata.tables["outbox_items"]
    with engine.connect() as connection:
        items = connection.execute(
            select(items_table.c.id, items_table.c.last_event_seq, items_table.c.payload).order_by(
                items_table.c.id
            )
        ).all()
        events = connection.execute(
            text("SELECT id, item_id, seq FROM outbox_events ORDER BY id")
        ).all()
    assert [tuple(row) for row in items] == [
        ("outbox/o/a", 3, {"to": "a"}),
        ("outbox/o/b", 7, {"to": "b"}),
    ]
    assert [(row.id, row.item_id, row.seq) for row in events] == [
        (event_ids[0], "outbox/o/a", 1),
        (event_ids[1], "outbox/o/a", 2),
        (event_ids[2], "outbox/o/a", 3),
        (event_ids[3], "outbox/o/b", 1),
    ]


def test_upgrade_twice_changes_nothing(engine_factory: EngineFactory) -> None:
    """The second upgrade of an up-to-date database neither fails nor touches its rows."""
    engine = engine_factory("twice")
    create_schema(engine)
    with engine.begin() as connection:
        connection.execute(insert(metadata.tables["outbox_events"]), [event_row("a", 1)])
    create_schema(engine)
    assert versions(engine) == [head_revision()]
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outbox_events")).scalar() == 1


def _start_up(urls: list[str], barrier: Any, results: Any) -> None:
    # Runs in a spawned process, as a worker or an API starting next to another would: a round
    # per database, every process starting on it at once.
    for round_, url in enumerate(urls):
        engine = make_engine(url)
        try:
            barrier.wait()
            create_schema(engine)
            results.put((round_, "ok"))
        except BaseException as err:
            results.put((round_, repr(err)))
        finally:
            engine.dispose()


def test_processes_upgrading_a_new_database_together_all_succeed(
    engine_factory: EngineFactory,
) -> None:
    """Several processes upgrading one empty database at once: each succeeds, it migrates once.
    Three rounds, each on a new database; the same processes take part in every round (a
    spawned process costs about a second and a half of CPU to import the read model)."""
    spawn = multiprocessing.get_context("spawn")
    processes, rounds = 4, 3
    engines = [engine_factory(f"together{round_}") for round_ in range(rounds)]
    urls = [engine.url.render_as_string(hide_password=False) for engine in engines]
    barrier, results = spawn.Barrier(processes, timeout=60), spawn.Queue()
    started = [
        spawn.Process(target=_start_up, args=(urls, barrier, results)) for _ in range(processes)
    ]
    for process in started:
        process.start()
    outcomes = [results.get(timeout=60) for _ in range(processes * rounds)]
    for process in started:
        process.join(timeout=60)
    for round_, engine in enumerate(engines):
        assert [outcome for r, outcome in outcomes if r == round_] == ["ok"] * processes, round_
        assert versions(engine) == [head_revision()]
        assert differences(engine, metadata) == []


def test_payload_blobs_gain_their_owner_and_keep_their_rows(engine_factory: EngineFactory) -> None:
    """0013: blobs stored before it keep their bytes, with no owner (so never pruned)."""
    engine = engine_factory("blobs")
    with schema_lock(engine) as connection:
        command.upgrade(alembic_config(connection), "0012")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO payload_blobs (digest, data, size, stored_at)"
                " VALUES ('d1', :data, 3, :at)"
            ),
            {"data": b"abc", "at": AT},
        )

    create_schema(engine)

    assert versions(engine) == [head_revision()]
    blobs = metadata.tables["payload_blobs"]
    with engine.connect() as connection:
        rows = connection.execute(select(blobs.c.digest, blobs.c.data, blobs.c.workflow_id)).all()
    assert [tuple(row) for row in rows] == [("d1", b"abc", None)]
    assert "ix_payload_blobs_workflow" in {
        i["name"] for i in inspect(engine).get_indexes("payload_blobs")
    }


def test_labour_history_keeps_its_rows_where_the_labour_type_is_registered(
    engine_factory: EngineFactory,
) -> None:
    """0018: `labour_history` leaves the product's schema. A database from before it keeps the
    table and its rows where labour is registered (its own branch adopts them); elsewhere the
    table goes, and the product's schema is `readmodel.models.metadata` alone."""
    labour = load_aggregate_types("examples.labour:LABOUR").migrations
    registered, unregistered = engine_factory("registered"), engine_factory("unregistered")
    for engine in (registered, unregistered):
        with schema_lock(engine) as connection:
            command.upgrade(alembic_config(connection), "0017")
        with engine.begin() as connection:
            connection.execute(
                insert(LABOUR_HISTORY).values(
                    labour_id="lab-1",
                    mother="m1",
                    mother_name="Ada",
                    status="planned",
                    contractions=2,
                    updates=0,
                    announcements=0,
                    subscribers=["s1"],
                    planned_at=AT,
                    last_seq=3,
                )
            )

    create_schema(registered, labour)
    create_schema(unregistered)

    assert sorted(versions(registered)) == [head_revision(), "labour_0002"]
    with registered.connect() as connection:
        rows = connection.execute(select(LABOUR_HISTORY.c.labour_id, LABOUR_HISTORY.c.subscribers))
        assert [tuple(row) for row in rows] == [("lab-1", ["s1"])]
    both = MetaData()
    for table in (*metadata.tables.values(), LABOUR_HISTORY):
        table.to_metadata(both)
    assert differences(registered, both) == []
    assert versions(unregistered) == [head_revision()]
    assert differences(unregistered, metadata) == []


# The previous release (0.1.0)'s newest revision: the schema a rollback to it must leave.
PREVIOUS_RELEASE_HEAD = "0017"


def schema_of(engine: Engine) -> dict[str, list[str]]:
    """Each table's columns, as an older release's code would find them."""
    found = inspect(engine)
    return {
        table: sorted(column["name"] for column in found.get_columns(table))
        for table in sorted(found.get_table_names())
        if table != "alembic_version"
    }


def test_a_rollback_to_the_previous_release_keeps_the_data(engine_factory: EngineFactory) -> None:
    """The way back to 0.1.0 (docs/how-to/upgrade.md): `alembic downgrade 0017`, then the
    labour branch to its base. The schema is then 0.1.0's, with every row, and the upgrade
    runs again on it."""
    labour = load_aggregate_types("examples.labour:LABOUR").migrations
    released = engine_factory("released")
    with schema_lock(released) as connection:
        command.upgrade(alembic_config(connection), PREVIOUS_RELEASE_HEAD)
    engine = engine_factory("rolled_back")
    create_schema(engine, labour)
    with engine.begin() as connection:
        item = {**item_row("k1", 0), "recipients": [], "last_event_seq": 2}
        del item["version"]
        connection.execute(insert(metadata.tables["outbox_items"]).values(item))
        connection.execute(insert(metadata.tables["outbox_events"]).values(event_row("k1", 1)))
        connection.execute(
            insert(LABOUR_HISTORY).values(
                labour_id="lab-1",
                mother="m1",
                mother_name="Ada",
                status="planned",
                contractions=2,
                updates=0,
                announcements=0,
                subscribers=["s1"],
                planned_at=AT,
                last_seq=3,
            )
        )

    with schema_lock(engine) as connection:
        command.downgrade(alembic_config(connection, labour), PREVIOUS_RELEASE_HEAD)
    with schema_lock(engine) as connection:
        command.downgrade(alembic_config(connection, labour), "labour@base")

    assert versions(engine) == [PREVIOUS_RELEASE_HEAD]
    assert schema_of(engine) == schema_of(released)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT key, last_event_seq FROM outbox_items")).all() == [
            ("k1", 2)
        ]
        assert connection.execute(text("SELECT seq FROM outbox_events")).scalars().all() == [1]
        assert connection.execute(text("SELECT labour_id FROM labour_history")).all() == [
            ("lab-1",)
        ]
    create_schema(engine, labour)
    assert sorted(versions(engine)) == [head_revision(), "labour_0002"]
    with engine.connect() as connection:
        assert connection.execute(text("SELECT labour_id FROM labour_history")).all() == [
            ("lab-1",)
        ]


def test_code_older_than_the_schema_refuses_it_naming_both_revisions(
    engine_factory: EngineFactory,
) -> None:
    """A newer release's revision in `alembic_version`: this code neither migrates nor uses the
    database, and says which revisions and how to go back."""
    engine = engine_factory("newer")
    create_schema(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    with pytest.raises(SchemaNewerThanCode) as refused:
        create_schema(engine)
    message = str(refused.value)
    assert "revision 0999" in message and f"its newest: {head_revision()}" in message
    assert f"`alembic downgrade {head_revision()}`" in message
    with pytest.raises(SchemaNewerThanCode):
        verify_schema(engine)
    assert versions(engine) == ["0999"]


def test_the_labour_branch_down_past_sealed_names_refills_them_from_the_event_store(
    engine_factory: EngineFactory,
) -> None:
    """`labour_0002` down: a sealed name would read as ciphertext to the older projector, so its
    row goes and the projector starts from the first event again; plain rows stay."""
    labour = load_aggregate_types("examples.labour:LABOUR").migrations
    engine = engine_factory("sealed_names")
    create_schema(engine, labour)
    row = {
        "mother": "m1",
        "status": "planned",
        "contractions": 0,
        "updates": 0,
        "announcements": 0,
        "subscribers": [],
        "planned_at": AT,
        "last_seq": 1,
    }
    with engine.begin() as connection:
        connection.execute(
            insert(LABOUR_HISTORY),
            [
                {**row, "labour_id": "plain", "mother_name": "Ada"},
                {**row, "labour_id": "sealed", "mother_name": "sealed1:k1:" + "A" * 300},
            ],
        )
        connection.execute(
            text(
                "INSERT INTO projector_checkpoints (name, position, status,"
                " consecutive_failures, updated_at) VALUES ('labour_history', 7, 'running', 0,"
                " :at)"
            ),
            {"at": AT},
        )

    with schema_lock(engine) as connection:
        command.downgrade(alembic_config(connection, labour), "labour_0001")

    with engine.connect() as connection:
        assert connection.execute(text("SELECT labour_id FROM labour_history")).all() == [
            ("plain",)
        ]
        assert (
            connection.execute(
                text("SELECT position FROM projector_checkpoints WHERE name = 'labour_history'")
            ).scalar_one()
            == 0
        )
