"""The standard Temporal settings (profile file and TEMPORAL_* variables) reach Client.connect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal import (
    TemporalConnection,
    TemporalUnavailable,
    connect,
    load_connect_config,
)
from durable_outbox_temporal.connection import ConnectionConfigError
from temporalio.client import Client
from temporalio.service import TLSConfig


@pytest.fixture
def connect_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Records every Client.connect call instead of dialling a cluster."""
    calls: list[dict[str, Any]] = []

    async def fake_connect(**kwargs: Any) -> Client:
        calls.append(kwargs)
        return object()  # type: ignore[return-value]

    monkeypatch.setattr(Client, "connect", staticmethod(fake_connect))
    return calls


def pem(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


async def test_no_file_and_no_variables_mean_the_local_dev_server(connect_calls, tmp_path) -> None:
    await connect({"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")})

    [call] = connect_calls
    assert call["target_host"] == "localhost:7233"
    assert call["namespace"] == "default"
    assert "api_key" not in call and "tls" not in call


async def test_standard_variables_reach_connect_with_mtls(connect_calls, tmp_path) -> None:
    cert = pem(tmp_path, "client.pem", "CLIENT CERT")
    key = pem(tmp_path, "client.key", "CLIENT KEY")
    ca = pem(tmp_path, "ca.pem", "SERVER CA")
    environ = {
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
        "TEMPORAL_ADDRESS": "orders.a1b2c.tmprl.cloud:7233",
        "TEMPORAL_NAMESPACE": "orders.a1b2c",
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(key),
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca),
        "TEMPORAL_TLS_SERVER_NAME": "orders.internal",
    }

    await connect(environ)

    [call] = connect_calls
    assert call["target_host"] == "orders.a1b2c.tmprl.cloud:7233"
    assert call["namespace"] == "orders.a1b2c"
    tls = call["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == b"CLIENT CERT" and tls.client_private_key == b"CLIENT KEY"
    assert tls.server_root_ca_cert == b"SERVER CA" and tls.domain == "orders.internal"


async def test_api_key_variable_turns_tls_on(connect_calls, tmp_path) -> None:
    await connect(
        {
            "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
            "TEMPORAL_ADDRESS": "eu-west-1.aws.api.temporal.io:7233",
            "TEMPORAL_API_KEY": "secret-key",
        }
    )

    [call] = connect_calls
    assert call["api_key"] == "secret-key" and call["tls"] is True


async def test_profile_file_reaches_connect_and_variables_override_it(
    connect_calls, tmp_path
) -> None:
    cert = pem(tmp_path, "client.pem", "PROFILE CERT")
    key = pem(tmp_path, "client.key", "PROFILE KEY")
    config = tmp_path / "temporal.toml"
    config.write_text(
        f"""
[profile.default]
address = "default.example:7233"

[profile.prod]
address = "prod.example:7233"
namespace = "prod-ns"
api_key = "profile-key"

[profile.prod.tls]
client_cert_path = "{cert}"
client_key_path = "{key}"
"""
    )
    environ = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "prod"}

    await connect(environ)
    await connect({**environ, "TEMPORAL_NAMESPACE": "override-ns"})

    first, overridden = connect_calls
    assert first["target_host"] == "prod.example:7233" and first["namespace"] == "prod-ns"
    assert first["api_key"] == "profile-key"
    assert isinstance(first["tls"], TLSConfig) and first["tls"].client_cert == b"PROFILE CERT"
    assert overridden["namespace"] == "override-ns"


def test_the_retired_variable_names_are_refused_not_ignored(tmp_path) -> None:
    # The names this project read before the standard: ignoring them would drop TLS silently.
    environ = {
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
        "TEMPORAL_TLS_CERT": "/etc/certs/client.pem",
    }

    with pytest.raises(ConnectionConfigError, match="TEMPORAL_TLS_CLIENT_CERT_PATH"):
        load_connect_config(environ)


async def test_unreachable_cluster_is_temporal_unavailable(tmp_path) -> None:
    environ = {
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
    }

    with pytest.raises(TemporalUnavailable, match="127.0.0.1:1"):
        await connect(environ)
    connection = TemporalConnection(environ)
    with pytest.raises(TemporalUnavailable):
        await connection.client()
