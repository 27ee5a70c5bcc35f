"""Submit and poll activities: the only code that talks to external providers.

Each destination's activities run on that destination's own task queues, whose rates the
Temporal server enforces; the class itself only translates provider outcomes into the typed
errors the item workflow understands.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.providers.base import PermanentProviderError, Provider, TransientProviderError
from contract.item import (
    POLL_ACTIVITY,
    SUBMIT_ACTIVITY,
    DeliveryErrorDetails,
    ItemErrorType,
    PollRequest,
    PollResult,
    SubmitRequest,
    SubmitResult,
)


class DeliveryActivities:
    """Submit/poll activities over a fixed set of providers, one per destination name."""

    def __init__(self, providers: Mapping[str, Provider]) -> None:
        self._providers = dict(providers)

    @activity.defn(name=SUBMIT_ACTIVITY)
    async def submit_item(self, request: SubmitRequest) -> SubmitResult:
        """Hand the item to its provider; raises typed errors the workflow retries or fails on."""
        provider = self._provider(request.destination)
        with _typed_errors():
            return await provider.submit(request)

    @activity.defn(name=POLL_ACTIVITY)
    async def poll_operation(self, request: PollRequest) -> PollResult:
        """Observe the provider's long-running operation once."""
        provider = self._provider(request.destination)
        with _typed_errors():
            return await provider.poll(request)

    def _provider(self, destination: str) -> Provider:
        provider = self._providers.get(destination)
        if provider is None:
            # A worker started without this destination's config: a deployment error that
            # retrying on this worker cannot fix.
            raise ApplicationError(
                f"this worker has no provider for destination {destination!r}",
                type=ItemErrorType.PERMANENT,
                non_retryable=True,
            )
        return provider


@contextlib.contextmanager
def _typed_errors() -> Iterator[None]:
    """Provider errors become the ApplicationError types the workflow retries or fails on."""
    try:
        yield
    except TransientProviderError as err:
        raise _transient(err) from err
    except PermanentProviderError as err:
        raise _permanent(err) from err


def _transient(err: TransientProviderError) -> ApplicationError:
    return ApplicationError(
        str(err),
        DeliveryErrorDetails(
            retry_after_s=err.retry_after_s, status_code=err.status_code, error_code=err.error_code
        ),
        type=ItemErrorType.TRANSIENT,
        non_retryable=True,
        # Expected and handled by the workflow: logged without a traceback, not as an error.
        category=ApplicationErrorCategory.BENIGN,
    )


def _permanent(err: PermanentProviderError) -> ApplicationError:
    return ApplicationError(
        str(err),
        DeliveryErrorDetails(status_code=err.status_code, error_code=err.error_code),
        type=ItemErrorType.PERMANENT,
        non_retryable=True,
    )
