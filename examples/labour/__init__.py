"""The labour example: the process manager (`domainmodel.py`), with a read model of its own, the
`labour_history` projector (`projectors.py`), whose table its own migrations make (`migrations/`,
the Alembic branch `labour`).

Registered by configuration as `examples.labour:LABOUR` (`AGGREGATE_TYPES`).
"""

from pathlib import Path

from examples.labour.domainmodel import LabourTracking
from examples.labour.projectors import LABOUR_HISTORY_PROJECTOR
from service.aggregate_types import AggregateType

LABOUR = AggregateType(
    LabourTracking(),
    projectors=(LABOUR_HISTORY_PROJECTOR,),
    migrations=Path(__file__).resolve().parent / "migrations",
)
