"""A booking service using the transactional outbox (docs/how-to/transactional-relay.md).

`POST /bookings` inserts the booking and its two confirmations — an email (`fake-email`) and an
SMS sent through a webhook (`fake-webhook`) — in ONE transaction of the application's database.
If anything fails before the commit, neither the booking nor a message exists; once it commits,
the relay running in `make dev`'s worker delivers each message exactly once.

The application shares the outbox's database (`DATABASE_URL`): that is what makes the booking
and its messages one transaction. Run it beside `make dev`:

    .venv/bin/uvicorn examples.booking_app:app --port 8100
    curl -s -X POST localhost:8100/bookings -H 'Content-Type: application/json' \\
      -d '{"id": "b-1", "customer": "Ada", "email": "ada@example.com", "phone": "+15550100",
           "at": "2030-01-01T09:30:00Z"}'
"""

from __future__ import annotations

from datetime import datetime

from durable_outbox_temporal.transactional import enqueue_in
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Column, DateTime, Engine, MetaData, String, Table, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from configuration.settings import get_settings
from readmodel.db import create_schema, make_engine

booking_metadata = MetaData()
BOOKINGS = Table(
    "example_bookings",
    booking_metadata,
    Column("id", String(64), primary_key=True),
    Column("customer", String(200), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
)


class Booking(BaseModel):
    id: str
    customer: str
    email: str
    phone: str
    at: datetime


def create_booking_app(engine: Engine) -> FastAPI:
    create_schema(engine)  # the outbox's tables, outbox_pending among them
    booking_metadata.create_all(engine)  # the application's own
    app = FastAPI(title="Booking example")

    @app.post("/bookings", status_code=201)
    def book(booking: Booking) -> dict[str, str]:
        try:
            with Session(engine) as session, session.begin():
                session.execute(
                    insert(BOOKINGS).values(id=booking.id, customer=booking.customer, at=booking.at)
                )
                when = f"{booking.at:%Y-%m-%d %H:%M} UTC"
                email_key = enqueue_in(
                    session,
                    outbox="bookings",
                    destination="fake-email",
                    key=f"{booking.id}-email",
                    payload={
                        "senderAddress": "bookings@example.com",
                        "recipients": {"to": [{"address": booking.email}]},
                        "content": {
                            "subject": f"Your appointment on {when}",
                            "plainText": f"Dear {booking.customer}, see you on {when}.",
                        },
                    },
                )
                sms_key = enqueue_in(
                    session,
                    outbox="bookings",
                    destination="fake-webhook",
                    key=f"{booking.id}-sms",
                    payload={"sms": {"to": booking.phone, "text": f"Appointment {when}"}},
                )
        except IntegrityError as err:
            raise HTTPException(409, f"booking {booking.id} exists") from err
        return {"booking": booking.id, "email": email_key, "sms": sms_key}

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn examples.booking_app:app`: built on first use, from the outbox's DATABASE_URL.
    if name == "app":
        return create_booking_app(make_engine(get_settings().database_url))
    raise AttributeError(name)
