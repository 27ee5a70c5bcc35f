"""Examples that run beside the service, each with its own tests: the seed aggregate types
(`flight/`, `labour/`, `lock/`, registered by `AGGREGATE_TYPES`) and a booking app using the
transactional outbox (`booking_app.py`)."""
