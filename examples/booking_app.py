"""A booking service using the transactional outbox (docs/how-to/transactional-relay.md).

`POST /bookings` inserts the booking and its two confirmations — an email (`fake-email`, ACS
Email) and then an SMS (`fake-sms`, ACS SMS) — in ONE transaction of the application's database.
If anything fails before the commit, neither the booking nor a message exists; once it commits,
the relay running in `make dev`'s worker delivers each message exactly once, in booking order:
both carry the booking's ordering key, so the SMS goes only once the email has ended.

The application shares the outbox's database (`DATABASE_URL`): that is what makes the booking
and its messages one transaction. Run it beside `make dev`:

    .venv/bin/uvicorn examples.booking_app:app --port 8100
    curl -s -X POST localhost:8100/bookings -H 'Content-Type: application/json' \\
      -d '{"id": "b-1", "customer": "Ada", "email": "ada@example.com", "phone": "+15550100",
           "at": "2030-01-01T09:30:00Z"}'
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from durable_outbox_temporal.contract.sms import is_e164
from durable_outbox_temporal.transactional import enqueue_in
from fastapi import FastAPI, HTTPException
from pydantic import AfterValidator, BaseModel
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


# The number the confirmations come from (an ACS phone number of the resource).
SENDER_PHONE = "+18005550100"


def _e164(phone: str) -> str:
    if not is_e164(phone):
        raise ValueError("must be a phone number in E.164 form, such as +15550100")
    return phone


class Booking(BaseModel):
    id: str
    customer: str
    email: str
    # Checked here, so a bad number is the caller's 422 rather than a message that cannot go.
    phone: Annotated[str, AfterValidator(_e164)]
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
                # One lane per booking: its email, then its SMS, in the order enqueued here.
                lane = f"booking-{booking.id}"
                email_key = enqueue_in(
                    session,
                    outbox="bookings",
                    destination="fake-email",
                    key=f"{booking.id}-email",
                    ordering_key=lane,
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
                    destination="fake-sms",
                    key=f"{booking.id}-sms",
                    ordering_key=lane,
                    payload={
                        "from": SENDER_PHONE,
                        "smsRecipients": [{"to": booking.phone}],
                        "message": f"Dear {booking.customer}, your appointment: {when}.",
                    },
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
