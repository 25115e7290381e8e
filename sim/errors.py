"""The npcsim exception tree.

    NpcsimError
    ├── ConfigError          a bad configuration value (names the field and the value)
    ├── ScenarioError        a broken scenario file (names the file, the NPC and the field)
    ├── OverBudgetError      mandatory content alone exceeds the budget, policy "raise"
    ├── StoreError           the SQLite store refused an operation
    │   ├── AuthorityError   a writer tried to change what it has no authority over
    │   ├── SchemaError      a store of another schema version, or not a database at all
    │   └── TamperError      a store or its journal does not match its seals (edited outside npcsim)
    ├── BusError             the MQTT bus failed
    │   └── OutboxFullError  a QoS 1 publish could not be queued during an outage
    ├── BrokerError          a broker could not be started or reached
    └── InferenceError       an inference backend failed
        ├── BackendTimeoutError
        ├── CircuitOpenError
        └── RejectedOutputError

Errors from the libraries below (aiomqtt, aiosqlite, httpx, msgspec) are translated into
these where they enter npcsim, with ``raise ... from``.
"""

from __future__ import annotations

__all__ = [
    "AuthorityError",
    "BackendTimeoutError",
    "BrokerError",
    "BusError",
    "CircuitOpenError",
    "ConfigError",
    "InferenceError",
    "NpcsimError",
    "OutboxFullError",
    "OverBudgetError",
    "RejectedOutputError",
    "ScenarioError",
    "ServerUnavailableError",
    "SchemaError",
    "StoreError",
    "TamperError",
    "single_error",
]


class NpcsimError(Exception):
    """Base of every error npcsim raises on purpose."""


class ConfigError(NpcsimError, ValueError):
    """A configuration value is out of range or unknown.

    A ValueError too, so msgspec reports it with the path of the field when it is raised
    while decoding a config.
    """


class ScenarioError(NpcsimError):
    """A scenario file cannot be loaded."""


class OverBudgetError(NpcsimError):
    """The mandatory content of a working memory alone exceeds the limit."""


class StoreError(NpcsimError):
    """The store refused an operation."""


class AuthorityError(StoreError):
    """A writer tried to change state it has no authority over."""


class SchemaError(StoreError):
    """The database file has an unknown schema or is not a database."""


class TamperError(StoreError):
    """A store, or its arrivals journal, does not match its seals: it was edited outside npcsim."""


class BusError(NpcsimError):
    """The MQTT bus failed."""


class OutboxFullError(BusError):
    """The bounded outbox is full while the broker is unreachable."""


class BrokerError(NpcsimError):
    """A broker could not be started or reached."""


class InferenceError(NpcsimError):
    """An inference backend failed."""


class BackendTimeoutError(InferenceError):
    """The backend did not answer in time."""


class CircuitOpenError(InferenceError):
    """The backend's circuit breaker is open: failing fast."""


class ServerUnavailableError(InferenceError):
    """A model server did not answer (connection refused or lost, 429, 5xx) after its
    retries: another server may."""


class RejectedOutputError(InferenceError):
    """The model's output was rejected by output handling."""


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a TaskGroup wrapped (Python 3.11 wraps the body's too); else the group.

    Context managers built on a TaskGroup raise this, so that callers see one BrokerError
    and not a group around it.
    """
    return group.exceptions[0] if len(group.exceptions) == 1 else group
