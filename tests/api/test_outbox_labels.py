"""The metrics' `outbox` label is bounded: configured outboxes, the most active others up to the
cap, and `other` for the rest, whatever number of outbox names callers use."""

from __future__ import annotations

from durable_outbox_temporal.contract.item import ItemStatus
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from api.backlog_metrics import BacklogMetrics
from api.outbox_labels import OTHER, OutboxLabels
from tests.api.conftest import Api
from tests.api.test_backlog_metrics import parse, refreshed
from tests.readmodel.test_backlog import put


def test_configured_outboxes_and_the_most_active_keep_their_names() -> None:
    labels = OutboxLabels(["billing"], cap=2)

    labels.admit_most_active({"quiet": 1, "busy": 50, "billing": 0, "middling": 10})
    labels.admit_most_active({"newcomer": 1000})  # full: labels are not taken back

    assert [labels.label(o) for o in ("billing", "busy", "middling", "quiet", "newcomer")] == [
        "billing",
        "busy",
        "middling",
        OTHER,
        OTHER,
    ]


async def test_the_backlog_sums_outboxes_without_a_label_under_other(engine: Engine) -> None:
    registry = CollectorRegistry()
    metrics = BacklogMetrics(
        registry, cache_s=0.0, timeout_s=5.0, labels=OutboxLabels(["kept"], cap=1)
    )
    metrics.attach(engine)
    put(engine, "k1", ItemStatus.QUEUED, outbox="kept")
    for n in range(3):
        put(engine, f"b{n}", ItemStatus.QUEUED, outbox="busy")
    for n in range(20):
        put(engine, f"f{n}", ItemStatus.QUEUED, outbox=f"flood-{n}", created_s=n)

    samples = await refreshed(metrics, registry)

    queued = {
        dict(labels)["outbox"]: value
        for (name, labels), value in samples.items()
        if name == "outbox_items" and dict(labels)["status"] == "queued"
    }
    assert queued == {"kept": 1, "busy": 3, OTHER: 20}
    outboxes = {dict(labels).get("outbox") for _, labels in samples} - {None}
    assert outboxes == {"kept", "busy", OTHER}
    await metrics.detach()


async def test_enqueues_to_many_outbox_names_add_a_bounded_number_of_series(
    api_factory,
) -> None:
    api: Api = await api_factory(metrics_outbox_labels=2, metrics_outboxes="billing")
    for outbox in ["billing", *(f"tenant-{n}" for n in range(12))]:
        accepted = await api.http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {}},
        )
        assert accepted.status_code == 202, accepted.text

    samples = parse((await api.http.get("/metrics")).text)

    outboxes = {dict(labels).get("outbox") for _, labels in samples} - {None}
    assert outboxes == {"billing", "tenant-0", "tenant-1", OTHER}
    created = {
        dict(labels)["outbox"]: value
        for (name, labels), value in samples.items()
        if name == "outbox_items_enqueued_total" and dict(labels)["result"] == "created"
    }
    assert created == {"billing": 1, "tenant-0": 1, "tenant-1": 1, OTHER: 10}
