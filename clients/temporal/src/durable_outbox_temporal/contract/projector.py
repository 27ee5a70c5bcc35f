"""The projector workflow's contract: one long-lived workflow per async projector."""

# No `from __future__ import annotations`: Temporal's converter reads these hints at run time.
from dataclasses import dataclass

WORKFLOW_TYPE = "Projector"
RUN_ACTIVITY = "run_projector"


def projector_workflow_id(name: str) -> str:
    """The one workflow of a projector: `projector/{name}`."""
    return f"projector/{name}"


@dataclass
class ProjectorInput:
    """Which projector, and the queue its activity runs on (the operations worker's)."""

    name: str
    operations_task_queue: str
