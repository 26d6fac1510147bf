"""Every error failsoft raises, in one place.

Foreign errors (pydantic, HiGHS, Ray, httpx, safetensors, OS) are mapped once, at the wrapper that
calls the foreign code, to the most specific failsoft error below, with ``raise ... from exc`` so the
cause is kept. Callers catch failsoft errors only; the CLI turns any of them into one line on stderr
and a non-zero exit code, never a traceback.

    FailsoftError
    ├── ConfigError              a scenario, config or argument is invalid (names the bad entry)
    ├── PlanningError            a policy could not produce a plan (solver failure, bad request)
    ├── RepositoryError          the on-disk model repository
    │   ├── ModelNotFoundError   no such family/variant, or a name that escapes the repository
    │   └── CorruptModelError    a weight file or config that cannot be read back
    └── ServingError             the runtime
        ├── ServerUnavailableError   the server holding a model is failed or unreachable
        ├── NoRouteError             no live route for an app before the request's deadline
        ├── StoreError               the state store (SQLite, Redis) failed
        ├── CapacityError            a load would exceed a server's memory capacity
        ├── ModelNotLoadedError      a server was asked to serve a variant it does not hold
        ├── DeadlineExceededError    a routed request got no answer before its deadline
        └── InvalidRequestError      a client request the gateway refuses (4xx): names what is wrong
"""

from __future__ import annotations


class FailsoftError(Exception):
    """Base of every failsoft error; its message is meant for the user as it is."""


class ConfigError(FailsoftError, ValueError):
    """Invalid scenario, config or argument. The message names the offending entry and value."""


class PlanningError(FailsoftError):
    """A policy could not produce a plan."""


class RepositoryError(FailsoftError):
    """The on-disk model repository could not serve a request."""


class ModelNotFoundError(RepositoryError, KeyError):
    """No such family or variant in the repository, or a name that would resolve outside it."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class CorruptModelError(RepositoryError):
    """A weight file, config or profile exists but cannot be read back."""


class ServingError(FailsoftError):
    """The serving runtime failed to do what was asked."""


class ServerUnavailableError(ServingError):
    """The server holding a model is failed, hung or unreachable."""


class NoRouteError(ServingError):
    """No live route exists for an app before the request's deadline."""


class StoreError(ServingError):
    """The state store (SQLite or Redis) failed."""


class CapacityError(ServingError):
    """A load would take a server past its configured memory capacity."""


class ModelNotLoadedError(ServingError):
    """A server was asked to serve (or unload) a variant it does not hold."""


class DeadlineExceededError(ServingError):
    """A request had a route but no answer came back before its deadline."""


class InvalidRequestError(ServingError):
    """A client request the gateway refuses with a 4xx; ``status`` is the HTTP status code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
