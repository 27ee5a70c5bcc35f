"""Connecting to Temporal the standard way: `temporalio.envconfig` profiles and variables.

The worker, the API, the CLI and any service using `OutboxClient` read the same settings as the
`temporal` CLI and every Temporal SDK: `TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`,
`TEMPORAL_API_KEY`, `TEMPORAL_TLS`, `TEMPORAL_TLS_CLIENT_CERT_PATH`,
`TEMPORAL_TLS_CLIENT_KEY_PATH`, `TEMPORAL_TLS_SERVER_CA_CERT_PATH`, `TEMPORAL_TLS_SERVER_NAME`,
and a TOML profile file (`TEMPORAL_CONFIG_FILE`, profile `TEMPORAL_PROFILE`). With none of them
set, the client connects to a local dev server.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import Client
from temporalio.envconfig import ClientConfig, ClientConnectConfig
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from durable_outbox_temporal.codec import (
    KeylessCodec,
    PayloadKeyMissing,
    codec_from_environment,
    data_converter,
    encrypted_with,
)
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.errors import TemporalUnavailable
from durable_outbox_temporal.tracing import temporal_interceptors

log = logging.getLogger("outbox.client")

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
# Names this project read before it followed the standard. Refused rather than ignored: a
# deployment still setting them would otherwise connect without the TLS it asked for.
RETIRED_VARIABLES = {
    "TEMPORAL_TLS_CERT": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_KEY": "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
}


class ConnectionConfigError(ValueError):
    """The Temporal connection settings are unusable; the message names the variable."""


def load_connect_config(
    environ: Mapping[str, str] | None = None,
    *,
    profile: str | None = None,
    config_file: str | None = None,
) -> ClientConnectConfig:
    """The `Client.connect` arguments the profile file and `TEMPORAL_*` variables describe.

    `environ` defaults to the process environment; `profile` and `config_file` override
    `TEMPORAL_PROFILE` and `TEMPORAL_CONFIG_FILE`. Raises `ConnectionConfigError` for a
    retired variable name.
    """
    variables = os.environ if environ is None else environ
    for retired, standard in RETIRED_VARIABLES.items():
        if retired in variables:
            raise ConnectionConfigError(f"{retired} is no longer read: set {standard} instead")
    config = ClientConfig.load_client_connect_config(
        profile=profile, config_file=config_file, override_env_vars=environ
    )
    # With no file and no variables envconfig names no address; the dev server is the default.
    config.setdefault("target_host", DEFAULT_ADDRESS)
    config.setdefault("namespace", DEFAULT_NAMESPACE)
    return config


async def connect(
    environ: Mapping[str, str] | None = None,
    *,
    profile: str | None = None,
    config_file: str | None = None,
    runtime: Runtime | None = None,
    **client_options: Any,
) -> Client:
    """A connected Temporal client, configured as `load_connect_config` describes.

    Raises `TemporalUnavailable` when the cluster cannot be reached. `client_options` go to
    `Client.connect` as they are (a data converter, interceptors).
    """
    config = load_connect_config(environ, profile=profile, config_file=config_file)
    # Traced when OTEL_* asks for it; the worker's workers take the interceptor from the client.
    client_options.setdefault("interceptors", temporal_interceptors())
    # Payloads encrypted when PAYLOAD_KEYS is set (the workers use the client's converter too).
    client_options.setdefault("data_converter", data_converter(codec_from_environment(environ)))
    try:
        return await Client.connect(**config, runtime=runtime, **client_options)
    except Exception as err:
        # Every failure of the connect call itself is the cluster not answering (or refusing
        # our credentials): the SDK raises a plain RuntimeError, so it is typed here, once.
        raise TemporalUnavailable(
            f"cannot connect to Temporal at {config['target_host']}: {err}"
        ) from err


class TemporalConnection:
    """A client that connects on first use, and again on the next use after a failure.

    The API starts (and `/readyz` reports why it is not ready) while Temporal is still down;
    requests meanwhile fail with `TemporalUnavailable` rather than an untyped error.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, **connect_options: Any) -> None:
        self._environ = environ
        self._connect_options = connect_options
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> Client:
        """The connected client; raises `TemporalUnavailable` while the cluster is unreachable."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await connect(self._environ, **self._connect_options)
            return self._client


async def check_stack_keys(client: Client, task_queue: str) -> None:
    """Raise `PayloadKeyMissing` when the stack on `task_queue` encrypts its payloads under a
    key this client lacks: a client without the stack's `PAYLOAD_KEYS` would write plain
    payloads into the histories of a stack that encrypts, and fail to read any of them.

    A client with no codec looks at one workflow of the stack (its input, as the server holds
    it); with none there yet, or a server that cannot list them, there is nothing to compare."""
    if not isinstance(client.data_converter.payload_codec, KeylessCodec):
        return  # a client with keys: a payload under another key fails its read, by name
    try:
        async for execution in client.list_workflows(
            f"TaskQueue = '{task_queue}'", limit=1, page_size=1
        ):
            history = await client.workflow_service.get_workflow_execution_history(
                GetWorkflowExecutionHistoryRequest(
                    namespace=client.namespace,
                    execution=WorkflowExecution(workflow_id=execution.id, run_id=execution.run_id),
                    maximum_page_size=1,
                )
            )
            for event in history.history.events[:1]:
                started = event.workflow_execution_started_event_attributes
                for payload in started.input.payloads:
                    key_id = encrypted_with(payload)
                    if key_id is not None:
                        raise PayloadKeyMissing(key_id, f"the stack on task queue {task_queue}")
    except RPCError as err:
        log.debug("payload keys of %s not checked: %s", task_queue, err)


async def missing_search_attributes(client: Client) -> list[str]:
    """The product's search attributes the client's namespace lacks (none: all registered).
    Without them every item's start is refused, so the worker and the API say so at once."""
    answer = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = set(answer.custom_attributes) | set(answer.system_attributes)
    return [key.name for key in search_attributes.ALL if key.name not in known]


def missing_search_attributes_message(missing: list[str]) -> str:
    """What the worker logs and `/readyz` answers when the namespace lacks search attributes."""
    return (
        f"the Temporal namespace lacks the search attributes {', '.join(missing)}: register"
        " them (Keyword) before items are enqueued (docs/how-to/connect-to-temporal.md)"
    )
