"""Destinations: where items go, how fast, and how hard to try. Loaded from TOML plus env overrides.

File format (`config/destinations.toml`)::

    [destinations.fake-email]
    provider = "acs-email"
    submit_rate = 1.5          # submit activities per second, enforced by the Temporal server
    poll_rate = 2.0            # poll activities per second
    max_attempts = 8
    [destinations.fake-email.settings]
    endpoint = "${FAKE_PROVIDER_URL}/acs"

String values may reference environment variables as `${NAME}` (or `${NAME:-default}`).
Any scalar field can be overridden by `DEST_<NAME>_<FIELD>`, the name upper-cased with `-` as
`_` (e.g. `DEST_FAKE_EMAIL_SUBMIT_RATE=3`), and a provider setting by
`DEST_<NAME>_SETTINGS_<KEY>` (e.g. `DEST_FAKE_WEBHOOK_SETTINGS_SECRET=...`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.ids import poll_task_queue, submit_task_queue
from common.models import DeliveryPolicy

_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class DestinationConfigError(ValueError):
    """The destinations file or an override is invalid; the message says where and why."""


class Destination(BaseModel):
    """One destination: its provider, rate limits and delivery policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    provider: str
    settings: dict[str, Any] = Field(default_factory=dict)
    submit_rate: float = Field(default=1.5, gt=0)
    poll_rate: float = Field(default=2.0, gt=0)
    max_attempts: int = Field(default=8, ge=1, le=1000)
    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_multiplier: float = Field(default=2.0, ge=1)
    backoff_max_s: float = Field(default=300.0, gt=0)
    backoff_jitter: float = Field(default=0.2, ge=0, le=1)
    poll_interval_s: float = Field(default=2.0, gt=0)
    poll_backoff_multiplier: float = Field(default=1.5, ge=1)
    poll_interval_max_s: float = Field(default=60.0, gt=0)
    poll_deadline_s: float = Field(default=3600.0, gt=0)
    submit_timeout_s: float = Field(default=30.0, gt=0)
    poll_timeout_s: float = Field(default=30.0, gt=0)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _NAME_PATTERN.match(name):
            raise ValueError("must be lower-case letters, digits and '-', at most 63 characters")
        return name

    @property
    def submit_task_queue(self) -> str:
        return submit_task_queue(self.name)

    @property
    def poll_task_queue(self) -> str:
        return poll_task_queue(self.name)

    def policy(self, max_attempts: int | None = None) -> DeliveryPolicy:
        """The snapshot a new item's workflow carries; `max_attempts` may only lower the limit."""
        attempts = (
            self.max_attempts if max_attempts is None else min(max_attempts, self.max_attempts)
        )
        return DeliveryPolicy(
            destination=self.name,
            submit_task_queue=self.submit_task_queue,
            poll_task_queue=self.poll_task_queue,
            max_attempts=attempts,
            backoff_initial_s=self.backoff_initial_s,
            backoff_multiplier=self.backoff_multiplier,
            backoff_max_s=self.backoff_max_s,
            backoff_jitter=self.backoff_jitter,
            poll_interval_s=self.poll_interval_s,
            poll_backoff_multiplier=self.poll_backoff_multiplier,
            poll_interval_max_s=self.poll_interval_max_s,
            poll_deadline_s=self.poll_deadline_s,
            submit_timeout_s=self.submit_timeout_s,
            poll_timeout_s=self.poll_timeout_s,
        )


class DestinationRegistry:
    """The loaded destinations, by name."""

    def __init__(self, destinations: Mapping[str, Destination]) -> None:
        self._destinations = dict(destinations)

    def __contains__(self, name: object) -> bool:
        return name in self._destinations

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._destinations.values())

    def __len__(self) -> int:
        return len(self._destinations)

    def get(self, name: str) -> Destination | None:
        return self._destinations.get(name)

    @property
    def names(self) -> list[str]:
        return sorted(self._destinations)

    @classmethod
    def from_file(cls, path: Path, environ: Mapping[str, str] | None = None) -> DestinationRegistry:
        """Load `path`, expand `${ENV}` references and apply `DEST_*` overrides."""
        environ = os.environ if environ is None else environ
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError as err:
            raise DestinationConfigError(f"destinations file not found: {path}") from err
        except tomllib.TOMLDecodeError as err:
            raise DestinationConfigError(f"{path}: invalid TOML: {err}") from err
        return cls.from_mapping(raw.get("destinations", {}), environ, source=str(path))

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
        source: str = "<config>",
    ) -> DestinationRegistry:
        environ = os.environ if environ is None else environ
        destinations: dict[str, Destination] = {}
        for name, fields in raw.items():
            if not isinstance(fields, Mapping):
                raise DestinationConfigError(f"{source}: destination {name!r} must be a table")
            merged = _apply_overrides(name, _expand_env(dict(fields), environ), environ)
            try:
                destinations[name] = Destination(name=name, **merged)
            except ValidationError as err:
                raise DestinationConfigError(f"{source}: destination {name!r}: {err}") from err
        return cls(destinations)


def _expand_env(value: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise DestinationConfigError(f"environment variable {name} is not set")

        return _ENV_REFERENCE.sub(substitute, value)
    if isinstance(value, dict):
        return {key: _expand_env(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, environ) for item in value]
    return value


def _apply_overrides(
    name: str, fields: dict[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    prefix = f"DEST_{name.upper().replace('-', '_')}_"
    settings_prefix = f"{prefix}SETTINGS_"
    settings = dict(fields.get("settings", {}))
    for env_name, env_value in environ.items():
        if env_name.startswith(settings_prefix):
            settings[env_name[len(settings_prefix) :].lower()] = env_value
        elif env_name.startswith(prefix):
            # Pydantic coerces the string to the field's type and reports bad values by name.
            fields[env_name[len(prefix) :].lower()] = env_value
    fields["settings"] = settings
    return fields
