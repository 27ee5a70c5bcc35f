"""The flight example: seats with one passenger each (`domainmodel.py`), no read model of its own.

Registered by configuration as `examples.flight:FLIGHT` (`AGGREGATE_TYPES`).
"""

from examples.flight.domainmodel import FlightSeating

FLIGHT = FlightSeating()
