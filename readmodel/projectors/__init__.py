"""The registered async projectors, by name: a new one is a module here and one line below."""

from readmodel.projectors.base import AsyncProjector
from readmodel.projectors.labour_history import LABOUR_HISTORY_PROJECTOR

PROJECTORS: dict[str, AsyncProjector] = {
    projector.name: projector for projector in (LABOUR_HISTORY_PROJECTOR,)
}
