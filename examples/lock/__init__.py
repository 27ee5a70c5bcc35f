"""The lock example: one holder at a time, its lease on a durable timer (`domainmodel.py`).

Registered by configuration as `examples.lock:LOCK` (`AGGREGATE_TYPES`).
"""

from examples.lock.domainmodel import Lock

LOCK = Lock()
